"""FlashAttention-2 as a registered program: its mapping (forward and backward blocks and warps,
"auto" being what the FA2 kernel launches or the paper's rule), how a mapping is resolved for a
GPU, how its forward or training program is built, and its AlgorithmSpec."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hbmsim.simulator import HbmsimError, Program

from .blocks import AUTO, FlashBlocks, halve_until, resolve_flash_blocks
from .common import bwd_tiles_per_step, fwd_tiles_per_step, tiles_per_step
from .flash2 import flash2_forward, flash2_sram_bytes
from .flash2_backward import flash2_bwd_sram_bytes, flash2_training
from . import flash2_rawkernel_tc as tc
from .flash2_teaching import TEACHING, teaching_forward_io, teaching_mapping
from .flash2_splitkv import (COMBINE_FIXED_INSTRUCTIONS, MAX_SPLITS, SPLITKV_BLOCK_M, SPLITKV_FIXED_INSTRUCTIONS,
                             SPLITKV_WARPS, auto_num_splits, flash2_splitkv_forward, flash2_splitkv_io, kernel_workload,
                             resolve_pack, splitkv_block_n, splitkv_steps)
from .io_formulas import flash2_backward_io, flash2_forward_io
from .paged import check_page_size
from .registry import AlgorithmSpec, register
from .workload import AttentionData, Workload

FA2_KERNEL, PAPER = "fa2-kernel", "paper"
# Registers per thread of FlashAttention-2's forward and backward kernels as compiled: 255, the
# most a thread may have (Nsight Compute launch__registers_per_thread on H100 for flash_fwd_kernel
# at head dims 64 and 128 and flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel, the FA2 kernels that
# PyTorch 2.11 vendors: scenarios/measured/h100-ncu-kernels.json). With 4 forward warps a block
# takes 32,768 of an SM's 65,536 registers, with 8 backward warps all of them.
FA2_KERNEL_REGISTERS_PER_THREAD = 255
# A forward warp's fixed instructions, run once a block (not a K/V step), by head dim: Nsight
# Compute's smsp__inst_executed.sum over blocks x 4 warps is F + s x steps, and two step counts
# give F (the same counts on an H100 and an H200): head dim 64, 2,201 at 1 step and 3,883 at 2
# (h100-ncu-short.json, N = 128 and 256): F = 519; 128, 3,257 at 2 steps (N = 128, 128 x 64 tiles)
# and 78,897 at 64 (N = 4096, h100-ncu-kernels.json): F = 817; 256 (64 x 64 tiles), 59,536 at 64
# steps (h200-ncu-pipes.json) and 61,368 at 66 (N = 4224, h100-ncu-one-wave.json): F = 912.
# Other head dims: not measured (0). Counted in the sm90 build PyTorch 2.11 vendors; used on the
# A100 too, whose sm80 build was not measured.
FA2_FWD_FIXED_INSTRUCTIONS = {64: 519, 128: 817, 256: 912}
# The same counts' step part s: a forward warp's instructions a K/V step (every kind: mma.sync,
# ldmatrix, softmax, address arithmetic), with the kernel's tile they were counted at, by head dim:
# (tile rows, block_kv, warps, s). 64: 128 x 128 tiles, s = 3,883 - 2,201 = 1,682; 128: 128 x 64,
# (78,897 - 3,257) / 62 = 1,220; 256: 64 x 64, (61,368 - 59,536) / 2 = 916 (the files above;
# tests/test_fixed_chain.py reads them). For the time model's warp_issue effect; another tile or
# head dim: not counted.
FA2_FWD_STEP_INSTRUCTIONS = {64: (128, 128, 4, 1682), 128: (128, 64, 4, 1220), 256: (64, 64, 4, 916)}


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
    # Split-KV (Flash-Decoding, FA2 v2.1+, algorithms/flash2_splitkv.py): K/V cut into num_splits
    # ranges, each a block writing fp32 partial O and log-sum-exp, then a combine kernel. 1 (the
    # default): no split, every existing result unchanged; "auto": FA2's num_splits_heuristic for
    # this GPU's SMs (it splits only when batch x heads x query blocks leave SMs idle, i.e. decode
    # and small batches); at most 128. The default is 1, not "auto", because the heuristic also
    # splits small prefill shapes (e.g. 1 x 1 heads of 1000 keys), which would change results and
    # closed forms that exist today: ask for "auto" where decode is modelled.
    num_splits: int | str = 1
    # Decode packing (FA2's seqlenq_ngroups_swapped): "auto" packs the query heads that share a
    # K/V head into one query block when seq_len_q = 1 (K/V read once per group); false: each
    # query head its own block (FA2 v2.0.x); true: packed (needs seq_len_q = 1). A no-op for
    # multi-head attention, so "auto" leaves every existing result unchanged.
    pack_gqa: bool | str = AUTO
    # KV-cache append (flash_attn_with_kvcache's k, v): the last seq_len_q rows of K and V are the
    # new tokens, read from K_new / V_new and written into the cache by the split kernel that also
    # reads it (FA2 runs that kernel for it even with one split). A program option, not a
    # workload field: the attention computed is the same, only where the new K/V come from.
    kv_append: bool = False
    # The query rows of the forward kernel's tile, which its MMAs and softmax run over, a block's
    # rows past seq_len_q included (flash_fwd_kernel.h: the tiled MMA covers kBlockM rows; only Q's
    # loads and O's stores stop at the sequence). "auto": variant "fa2-kernel", the kernel's kBlockM
    # before block_q is clipped to a shorter sequence (decode's 1-8 rows compute 64 or 128); the
    # other variants, block_q (no padded rows). A longer sequence's partial last block computes the
    # whole tile too. Sets the compute the time model sees, never a byte.
    q_tile_rows: int | str = AUTO


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
    br, bc = halve_until(br, bc, lambda r, c: need(r, c) <= limit)
    if (br, bc) != b0:
        notes.append(f"the kernel's {what} blocks {b0[0]}x{b0[1]} do not fit sram_bytes_per_sm = {limit}: "
                     f"{br}x{bc}")
    return br, bc


def uses_splitkv(m: Flash2Blocks, training: bool = False) -> bool:
    """Whether the forward runs FA2's split-KV kernel: more than one split, or the KV append."""
    return not training and (m.num_splits != 1 or m.kv_append is True)


def _resolve_decode(gpu, wl: Workload, m: Flash2Blocks, training: bool) -> tuple:
    """num_splits, pack_gqa and kv_append checked and resolved: (mapping, kernel workload,
    whether the split kernel runs). Bad values: one line (HbmsimError)."""
    ns, ka = m.num_splits, m.kv_append
    check_page_size(wl)                # a paged KV cache (algorithms/paged.py): FA2's page sizes
    if training and wl.kv_page_size is not None:
        raise HbmsimError(f"flash2: kv_page_size = {wl.kv_page_size}: FA2 pages the KV cache of inference only "
                          "(block_table is a forward argument): run the forward pass alone")
    if ns != AUTO and ns > MAX_SPLITS:
        raise HbmsimError(f"flash2: num_splits = {ns} is more than FA2's split-KV kernel allows ({MAX_SPLITS})")
    if ka not in (True, False):
        raise HbmsimError(f"flash2: kv_append = {ka!r} must be true or false")
    if ka and wl.seq_len_q > wl.seq_len_kv:
        raise HbmsimError(f"flash2: kv_append needs seq_len_q = {wl.seq_len_q} new tokens within seq_len_kv = "
                          f"{wl.seq_len_kv}")
    pack = resolve_pack(wl, m.pack_gqa) if m.variant == FA2_KERNEL and not training else False
    if m.variant in (PAPER, TEACHING) and (m.pack_gqa is True or ka or ns not in (1, AUTO)):
        raise HbmsimError("flash2: num_splits, pack_gqa and kv_append model the FA2 kernel: use variant \"fa2-kernel\"")
    if training and (ka or ns not in (1, AUTO)):
        raise HbmsimError("flash2: split-KV and kv_append are forward-only (inference): run the forward pass alone")
    if (ka or ns not in (1, AUTO)) and wl.dropout > 0:
        raise HbmsimError("flash2: split-KV and kv_append have no dropout in FA2: set dropout = 0")
    m = replace(m, pack_gqa=pack)
    weff, _ = kernel_workload(wl, m)
    if ns == AUTO:
        if training or m.variant == PAPER or m.variant == TEACHING:
            ns = 1
        else:
            bq = SPLITKV_BLOCK_M if m.block_q == AUTO else m.block_q
            bc = splitkv_block_n(wl.head_dim) if m.block_kv == AUTO else m.block_kv
            ns = auto_num_splits(weff, bq, bc, gpu.sm_count)
    m = replace(m, num_splits=ns)
    return m, weff, uses_splitkv(m, training)


def _resolve(gpu, wl: Workload, m: Flash2Blocks, training: bool) -> tuple:
    m, teaching_notes = teaching_mapping(wl, m, training, FA2_KERNEL) if m.variant == TEACHING else (m, ())
    m, weff, split = _resolve_decode(gpu, wl, m, training)
    m, notes = _resolve_blocks(gpu, weff, m, training, split)
    return m, tuple(teaching_notes) + tuple(notes)


def _resolve_blocks(gpu, wl: Workload, m: Flash2Blocks, training: bool, split: bool) -> tuple:
    if m.variant == PAPER:
        need = lambda br, bc: max(flash2_sram_bytes(wl, br, bc), flash2_bwd_sram_bytes(wl, br, bc) if training else 0)
        fwd, notes = resolve_flash_blocks(gpu.sram_bytes_per_sm, wl, FlashBlocks(m.block_q, m.block_kv), need)
        bwd = (fwd.block_q if m.block_q_bwd == AUTO else m.block_q_bwd,
               fwd.block_kv if m.block_kv_bwd == AUTO else m.block_kv_bwd)
        return replace(m, block_q=fwd.block_q, block_kv=fwd.block_kv, block_q_bwd=bwd[0], block_kv_bwd=bwd[1],
                       q_tile_rows=_q_tile_rows(m, wl, fwd.block_q, fwd.block_q),
                       warps=4 if m.warps == AUTO else m.warps,
                       warps_bwd=4 if m.warps_bwd == AUTO else m.warps_bwd), notes
    kernel_fwd, kernel_bwd = fa2_kernel_blocks(gpu.sram_bytes_per_sm, wl)
    warps = fa2_kernel_warps(gpu.sram_bytes_per_sm, wl)
    if split:      # the split kernel's 64 x kBlockN tiles and 4 warps (run_mha_fwd_splitkv_dispatch)
        kernel_fwd, warps = (SPLITKV_BLOCK_M, splitkv_block_n(wl.head_dim)), (SPLITKV_WARPS, warps[1])
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
    out["q_tile_rows"] = _q_tile_rows(m, wl, kernel_fwd[0] if m.block_q == AUTO else m.block_q, out["block_q"])
    return replace(m, **out), tuple(notes)


def _q_tile_rows(m: Flash2Blocks, wl: Workload, unclipped: int, block_q: int) -> int:
    """The resolved q_tile_rows: the user's (at least block_q), else the tile before the sequence
    clipped it (`unclipped`) unless an SRAM fit shrank block_q below that clip; block_q where the
    variant computes only its rows (paper, teaching)."""
    if m.q_tile_rows != AUTO:
        if m.q_tile_rows < block_q:
            raise HbmsimError(f"flash2: q_tile_rows = {m.q_tile_rows} must be at least block_q = {block_q} (the "
                              "tile holds the block's rows)")
        return m.q_tile_rows
    if m.variant != FA2_KERNEL:
        return block_q
    return unclipped if block_q >= min(unclipped, wl.seq_len_q) else block_q


def _build(wl: Workload, m: Flash2Blocks, data: AttentionData | None, training: bool, fast: bool = False) -> Program:
    """`fast`: inner loops longer than common.COARSE_ABOVE_TILES tiles run several tiles a step."""
    regs = FA2_KERNEL_REGISTERS_PER_THREAD if m.variant == FA2_KERNEL else 0
    kernel = m.variant == FA2_KERNEL        # FA2's own kernels: their fixed instructions as Nsight counted them
    fixed = FA2_FWD_FIXED_INSTRUCTIONS.get(wl.head_dim, 0) if kernel else 0
    step_instructions = FA2_FWD_STEP_INSTRUCTIONS.get(wl.head_dim, ()) if kernel else ()
    # rows each block computes (0: its own; a mapping built unresolved)
    tile_rows = 0 if m.q_tile_rows == AUTO else m.q_tile_rows
    if m.variant == TEACHING:          # the teaching kernel (flash2_teaching.py): forward only
        step = tiles_per_step(math.ceil(wl.seq_len_kv / m.block_kv), not wl.causal) if fast else 1
        return flash2_forward(wl, m.block_q, m.block_kv, data, m.warps, step, 0, teaching=True)
    if not training:
        new_tokens = wl.seq_len_q if m.kv_append is True else 0
        wl, data = kernel_workload(wl, m, data)
        if uses_splitkv(m):
            return flash2_splitkv_forward(wl, m.block_q, m.block_kv, m.num_splits, data, new_tokens, m.warps,
                                          fast, regs, tile_rows=tile_rows,
                                          fixed_instructions=(SPLITKV_FIXED_INSTRUCTIONS.get(wl.head_dim, 0),
                                                              COMBINE_FIXED_INSTRUCTIONS.get(wl.head_dim, 0))
                                          if kernel else (0, 0))
    fwd_step = fwd_tiles_per_step(wl, m.block_q, m.block_kv) if fast else 1
    if training:
        bwd_step = bwd_tiles_per_step(wl, m.block_q_bwd, m.block_kv_bwd) if fast else 1
        return flash2_training(wl, m.block_q, m.block_kv, data, (m.block_q_bwd, m.block_kv_bwd),
                               warps=(m.warps, m.warps_bwd), tiles_per_step=(fwd_step, bwd_step),
                               registers_per_thread=regs, fixed_instructions=fixed,
                               step_instructions=step_instructions, tile_rows=tile_rows, whole_tiles=kernel)
    return flash2_forward(wl, m.block_q, m.block_kv, data, m.warps, fwd_step, regs, tile_rows=tile_rows,
                          fixed_instructions=fixed, step_instructions=step_instructions, whole_kv=kernel)


def _io(wl: Workload, m: Flash2Blocks, pass_name: str) -> dict:
    if m.variant == TEACHING:
        return teaching_forward_io(wl, m.block_q, m.block_kv)
    if pass_name == "forward":
        new_tokens = wl.seq_len_q if m.kv_append is True else 0
        wl, _ = kernel_workload(wl, m)
        if uses_splitkv(m):
            return flash2_splitkv_io(wl, m.block_q, m.block_kv, m.num_splits, new_tokens)
        return flash2_forward_io(wl, m.block_q, m.block_kv)
    return flash2_backward_io(wl, m.block_q_bwd, m.block_kv_bwd)


def _sram_bytes(wl: Workload, m: Flash2Blocks, training: bool) -> int:
    wl = wl if training else kernel_workload(wl, m)[0]
    fwd = flash2_sram_bytes(wl, m.block_q, m.block_kv)
    return max(fwd, flash2_bwd_sram_bytes(wl, m.block_q_bwd, m.block_kv_bwd)) if training else fwd


def _steps(wl: Workload, m: Flash2Blocks, training: bool, fast: bool = False) -> int:
    c = math.ceil
    if not training:
        wl = kernel_workload(wl, m)[0]
        if uses_splitkv(m):
            return splitkv_steps(wl, m.block_q, m.block_kv, m.num_splits, fast)
    kv_tiles = c(wl.seq_len_kv / m.block_kv)
    fwd_step = fwd_tiles_per_step(wl, m.block_q, m.block_kv) if fast else 1
    steps = wl.groups * c(wl.seq_len_q / m.block_q) * c(kv_tiles / fwd_step)
    if training:      # the backward visits every (K/V block, query block) pair, about twice the work
        q_tiles = c(wl.seq_len_q / m.block_q_bwd)
        q_steps = c(q_tiles / (bwd_tiles_per_step(wl, m.block_q_bwd, m.block_kv_bwd) if fast else 1))
        steps += 2 * wl.groups * c(wl.seq_len_kv / m.block_kv_bwd) * q_steps
    return steps


def _describe(m: Flash2Blocks) -> str:
    same = (m.block_q_bwd, m.block_kv_bwd) == (m.block_q, m.block_kv)
    text = f"{m.block_q}x{m.block_kv}" + ("" if same else f" bwd {m.block_q_bwd}x{m.block_kv_bwd}")
    text += f" split {m.num_splits}" if m.num_splits not in (1, AUTO) else ""
    text += " packed" if m.pack_gqa is True else ""
    text += " +append" if m.kv_append is True else ""
    return text + {PAPER: " (paper)", TEACHING: " (teaching kernel)"}.get(m.variant, "")


SPEC = register(AlgorithmSpec(
    name="flash2", label="FlashAttention-2 (Dao 2023)", mapping_type=Flash2Blocks,
    **tc.hooks(build=_build, io=_io, sram_bytes=_sram_bytes, resolve=_resolve, steps=_steps, describe=_describe),
    auto_fields=("block_q", "block_kv", "block_q_bwd", "block_kv_bwd", "warps", "warps_bwd", "num_splits",
                 "q_tile_rows"),
    bool_fields=("pack_gqa", "kv_append"),
    variants=(FA2_KERNEL, PAPER, tc.RAWKERNEL_TC, TEACHING),
    match_fields=("block_q", "block_kv"), kernel="flash_attention", emulated=True, coarsens=True, paged_kv=True,
    variant_kernels=((tc.RAWKERNEL_TC, "flash_attention_tc"), (TEACHING, "flash_attention"))))
