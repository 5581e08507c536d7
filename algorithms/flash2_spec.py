"""FlashAttention-2 as a registered program: its mapping (forward and backward blocks and warps,
"auto" being what the FA2 kernel launches or the paper's rule), how a mapping is resolved for a
GPU, how its forward or training program is built, and its AlgorithmSpec."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hbmsim.simulator import Program

from .blocks import AUTO, FlashBlocks, resolve_flash_blocks
from .common import tiles_per_step
from .flash2 import flash2_forward, flash2_sram_bytes
from .flash2_backward import flash2_bwd_sram_bytes, flash2_training
from .io_formulas import flash2_backward_io, flash2_forward_io
from .registry import AlgorithmSpec, register
from .workload import AttentionData, Workload

FA2_KERNEL, PAPER = "fa2-kernel", "paper"
# Registers per thread of FlashAttention-2's forward and backward kernels as compiled: 255, the
# most a thread may have (Nsight Compute launch__registers_per_thread on H100 for flash_fwd_kernel
# at head dims 64 and 128 and flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel, the FA2 kernels that
# PyTorch 2.11 vendors: scenarios/measured/h100-ncu-kernels.json). With 4 forward warps a block
# takes 32,768 of an SM's 65,536 registers, with 8 backward warps all of them.
FA2_KERNEL_REGISTERS_PER_THREAD = 255


@dataclass(frozen=True)
class Flash2Blocks:
    """flash2's mapping: the forward's block_q x block_kv and the backward's, each a number or
    "auto". variant "fa2-kernel" (the default): "auto" is what the FlashAttention-2 kernel
    launches (fa2_kernel_blocks); variant "paper": "auto" is the FlashAttention paper's rule,
    and the backward uses the forward's blocks."""
    block_q: int | str = AUTO
    block_kv: int | str = AUTO
    block_q_bwd: int | str = AUTO
    block_kv_bwd: int | str = AUTO
    variant: str = FA2_KERNEL
    # kNWarps of the forward and backward kernels: they set the shared-memory reads the time model
    # sees (every warp reads its operand slices), never a byte of traffic; "auto": the kernel's
    # (fa2_kernel_warps), 4 for the paper variant
    warps: int | str = AUTO
    warps_bwd: int | str = AUTO


def fa2_kernel_warps(sram_bytes_per_sm: int, wl: Workload) -> tuple[int, int]:
    """(forward kNWarps, backward kNWarps) of the same launch templates: the forward runs 4 warps
    except the 128 x 64 tiles of head dims 192-256, which run 8; every backward runs 8."""
    d = wl.head_dim
    fwd, _ = fa2_kernel_blocks(sram_bytes_per_sm, wl)
    return (8 if d > 160 and fwd == (128, 64) else 4), 8


def fa2_kernel_blocks(sram_bytes_per_sm: int, wl: Workload) -> tuple[tuple, tuple]:
    """((forward kBlockM, kBlockN), (backward kBlockM, kBlockN)) of the FlashAttention-2 kernel,
    v2.0.0 to v2.3.6 (the launch templates are identical over these tags): forward from
    csrc/flash_attn/src/flash_fwd_launch_template.h (run_mha_fwd_hdim32 .. hdim256), backward
    from flash_bwd_launch_template.h (run_mha_bwd_hdim32 .. hdim256). The head dim is rounded up
    to the kernel's 32/64/96/128/160/192/224/256. H100 runs the sm80 code path (FA2 has no sm90
    kernel), so A100 and H100 choose alike except where the templates test shared memory:
    `sram_bytes_per_sm` stands for cudaDevAttrMaxSharedMemoryPerBlockOptin (A100 163 KB, H100
    227 KB) and that plus 1 KB for the per-SM figure. The sm86/sm89 rows are not modelled."""
    d, smem = wl.head_dim, sram_bytes_per_sm
    dropout = wl.dropout > 0
    kb = 1024
    if d <= 32:
        fwd = (128, 128)
        bwd = (128, 128)
    elif d <= 64:
        fwd = (128, 64) if dropout else (128, 128)
        bwd = (128, 128) if smem >= 144 * kb else (64, 128)
    elif d <= 96:
        fwd, bwd = (128, 64), (64, 128)
    elif d <= 128:
        fwd = (128, 32) if dropout else (128, 64)
        bwd = (64, 128) if smem >= 144 * kb else (64, 64)
    elif d <= 160:
        fwd, bwd = (128, 32), (64, 64)
    elif d <= 192:
        fwd = (64, 64) if dropout else (128, 64)
        bwd = (64, 64)
    elif d <= 224:
        fwd, bwd = ((128, 64) if smem >= 112 * kb else (64, 64)), (64, 64)
    else:     # 256: 128 x 64 needs 128 KB per block and less than 192 KB per SM, i.e. A100 not H100
        fwd = (128, 64) if smem >= 128 * kb and smem + kb < 192 * kb else (64, 64)
        bwd = (64, 64)
    return fwd, bwd


def _fit(br: int, bc: int, need, limit: int, what: str, notes: list) -> tuple[int, int]:
    """Halve the larger block until `need` fits the simulated SRAM, saying so."""
    b0 = (br, bc)
    while need(br, bc) > limit and (br > 1 or bc > 1):
        if bc > 1 and bc >= br:
            bc //= 2
        else:
            br //= 2
    if (br, bc) != b0:
        notes.append(f"the kernel's {what} blocks {b0[0]}x{b0[1]} do not fit sram_bytes_per_sm = {limit}: "
                     f"{br}x{bc}")
    return br, bc


def _resolve(gpu, wl: Workload, m: Flash2Blocks, training: bool) -> tuple:
    if m.variant == PAPER:
        need = lambda br, bc: max(flash2_sram_bytes(wl, br, bc), flash2_bwd_sram_bytes(wl, br, bc) if training else 0)
        fwd, notes = resolve_flash_blocks(gpu.sram_bytes_per_sm, wl, FlashBlocks(m.block_q, m.block_kv), need)
        bwd = (fwd.block_q if m.block_q_bwd == AUTO else m.block_q_bwd,
               fwd.block_kv if m.block_kv_bwd == AUTO else m.block_kv_bwd)
        return replace(m, block_q=fwd.block_q, block_kv=fwd.block_kv, block_q_bwd=bwd[0], block_kv_bwd=bwd[1],
                       warps=4 if m.warps == AUTO else m.warps,
                       warps_bwd=4 if m.warps_bwd == AUTO else m.warps_bwd), notes
    kernel_fwd, kernel_bwd = fa2_kernel_blocks(gpu.sram_bytes_per_sm, wl)
    warps = fa2_kernel_warps(gpu.sram_bytes_per_sm, wl)
    notes: list = []
    out = {"warps": warps[0] if m.warps == AUTO else m.warps,
           "warps_bwd": warps[1] if m.warps_bwd == AUTO else m.warps_bwd}
    for key, kernel, seq_field in (("block_q", kernel_fwd[0], "seq_len_q"), ("block_kv", kernel_fwd[1], "seq_len_kv"),
                                   ("block_q_bwd", kernel_bwd[0], "seq_len_q"),
                                   ("block_kv_bwd", kernel_bwd[1], "seq_len_kv")):
        value, seq = getattr(m, key), getattr(wl, seq_field)
        if value == AUTO:
            value = min(kernel, seq)      # tiles are clipped to the sequence: the same bytes, less SRAM
        elif value > seq:
            notes.append(f"{key} = {value} is longer than {seq_field} = {seq}: clamped to {seq}")
            value = seq
        out[key] = value
    # The kernel's own choice is shrunk to fit a smaller simulated SRAM (saying so); blocks the
    # user gave are kept, and a block that does not fit is an error before simulating.
    limit = gpu.sram_bytes_per_sm
    if m.block_q == AUTO and m.block_kv == AUTO:
        out["block_q"], out["block_kv"] = _fit(out["block_q"], out["block_kv"],
                                               lambda r, c: flash2_sram_bytes(wl, r, c), limit, "forward", notes)
    if training and m.block_q_bwd == AUTO and m.block_kv_bwd == AUTO:
        out["block_q_bwd"], out["block_kv_bwd"] = _fit(out["block_q_bwd"], out["block_kv_bwd"],
                                                       lambda r, c: flash2_bwd_sram_bytes(wl, r, c), limit,
                                                       "backward", notes)
    return replace(m, **out), tuple(notes)


def _build(wl: Workload, m: Flash2Blocks, data: AttentionData | None, training: bool, fast: bool = False) -> Program:
    """`fast`: inner loops longer than common.COARSE_ABOVE_TILES tiles run several tiles a step."""
    fwd_step = tiles_per_step(math.ceil(wl.seq_len_kv / m.block_kv)) if fast else 1
    regs = FA2_KERNEL_REGISTERS_PER_THREAD if m.variant == FA2_KERNEL else 0
    if training:
        bwd_step = tiles_per_step(math.ceil(wl.seq_len_q / m.block_q_bwd)) if fast else 1
        return flash2_training(wl, m.block_q, m.block_kv, data, (m.block_q_bwd, m.block_kv_bwd),
                               warps=(m.warps, m.warps_bwd), tiles_per_step=(fwd_step, bwd_step),
                               registers_per_thread=regs)
    return flash2_forward(wl, m.block_q, m.block_kv, data, m.warps, fwd_step, regs)


def _io(wl: Workload, m: Flash2Blocks, pass_name: str) -> dict:
    if pass_name == "forward":
        return flash2_forward_io(wl, m.block_q, m.block_kv)
    return flash2_backward_io(wl, m.block_q_bwd, m.block_kv_bwd)


def _sram_bytes(wl: Workload, m: Flash2Blocks, training: bool) -> int:
    fwd = flash2_sram_bytes(wl, m.block_q, m.block_kv)
    return max(fwd, flash2_bwd_sram_bytes(wl, m.block_q_bwd, m.block_kv_bwd)) if training else fwd


def _steps(wl: Workload, m: Flash2Blocks, training: bool, fast: bool = False) -> int:
    c = math.ceil
    kv_tiles = c(wl.seq_len_kv / m.block_kv)
    steps = wl.groups * c(wl.seq_len_q / m.block_q) * c(kv_tiles / (tiles_per_step(kv_tiles) if fast else 1))
    if training:      # the backward visits every (K/V block, query block) pair, about twice the work
        q_tiles = c(wl.seq_len_q / m.block_q_bwd)
        q_steps = c(q_tiles / (tiles_per_step(q_tiles) if fast else 1))
        steps += 2 * wl.groups * c(wl.seq_len_kv / m.block_kv_bwd) * q_steps
    return steps


def _describe(m: Flash2Blocks) -> str:
    same = (m.block_q_bwd, m.block_kv_bwd) == (m.block_q, m.block_kv)
    text = f"{m.block_q}x{m.block_kv}" + ("" if same else f" bwd {m.block_q_bwd}x{m.block_kv_bwd}")
    return text + (" (paper)" if m.variant == PAPER else "")


SPEC = register(AlgorithmSpec(
    name="flash2", label="FlashAttention-2 (Dao 2023)", mapping_type=Flash2Blocks,
    build=_build, io=_io, sram_bytes=_sram_bytes, resolve=_resolve, steps=_steps, describe=_describe,
    auto_fields=("block_q", "block_kv", "block_q_bwd", "block_kv_bwd", "warps", "warps_bwd"),
    variants=(FA2_KERNEL, PAPER),
    match_fields=("block_q", "block_kv"), kernel="flash_attention", emulated=True, coarsens=True))
