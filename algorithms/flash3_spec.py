"""FlashAttention-3 as a registered program: its mapping ("auto" = the tiles and stages the FA3
kernel picks on sm90), how it is resolved for a GPU (refused without TMA/wgmma), its build, its
closed forms and its AlgorithmSpec.

The kernel's rules, from Dao-AILab/flash-attention (commit 0251105a2fb19d2957484b7f023cd8c115286ced):
- forward tiles: hopper/tile_size.h, tile_size_fwd_sm90 (lines 10-55) returns {kBlockM, kBlockN,
  MmaPV_is_RS, IntraWGOverlap}; 16-bit at lines 13-40, FP8 (element_size 1) at lines 41-54;
- forward stages: hopper/flash_fwd_launch_template.h line 47, kStages = 2 for Arch >= 90;
- warpgroups: kBlockM / 64 (mainloop_fwd_sm90_tma_gmma_ws.hpp line 89); ping-pong (the
  scheduler barrier) at lines 352-355: with IntraWGOverlap, 2+ warpgroups and head dim <= 128
  (16-bit) or >= 128 (FP8);
- one thread block per SM: flash_fwd_kernel_sm90.h line 77, MinBlocksPerMultiprocessor = 1;
- backward tiles: hopper/flash_bwd_launch_template.h, run_mha_bwd_hdim64 .. hdim256 (lines
  311-390), the Arch >= 90 branches: kBlockM x kBlockN, Stages_dO and NumMmaWarpGroups.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from hbmsim.simulator import HbmsimError, Program

from .blocks import AUTO
from .common import bwd_tiles_per_step, fwd_tiles_per_step
from .flash2_splitkv import fewest_splits, flash2_splitkv_io
from .flash3 import WG_ROWS, flash3_forward, flash3_sram_bytes
from .flash3_combine import combine_blocks, combine_tile
from .flash3_pack import PackGQA
from .flash3_backward import fa3_bwd_traits, flash3_bwd_sram_bytes, flash3_training
from .io_flash3 import flash3_backward_io, flash3_forward_io
from .registry import AlgorithmSpec, register
from .workload import AttentionData, Workload

FA3_KERNEL, FP8, CUDNN = "fa3-kernel", "fp8", "cudnn-sm90"
# cudnn-sm90: torch's cuDNN attention on sm90 (a warp-specialised TMA + wgmma kernel of the same family,
# its tiles and schedule cuDNN's own), run as FA3's program with one trait of its own measured: its
# backward main kernel's warp instructions a score, all issued while its lock-stepped warpgroups are
# off the tensor pipe (the backward's step: flash3_backward.py). Nsight Compute 2025.3.1 on the
# kernel cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_* at N = 4096, batch-heads
# 128, 64 and 32 (head dims 64, 128, 256): smsp__inst_executed.sum / (batch-heads x N^2), the same on
# an H100 and an H200 at 64 and 128 (scenarios/measured/h100-ncu-pipes.json, h200-ncu-pipes.json),
# 256 on an H200 (h200-ncu-cudnn-bwd.json, 2026-11-27); there the kernel's cycles off the tensor pipe,
# 0.154, 0.168 and 0.383 a score, are 93%, 103% and 87% of these instructions at 4 an SM-clock.
# The count is the kernel's, not the length's or the mask's: at N = 1024 (head dim 64) 0.5830 a
# score (+1.8%), under a causal mask 0.5580 a computed score (-2.6%; h200-ncu-cudnn-bwd.json).
# Other head dims were not measured: FA3's FP32 counting.
CUDNN_BWD_INSTRUCTIONS_PER_SCORE = {64: 0.5727, 128: 0.6959, 256: 1.7538}
# fa3-kernel: FlashAttention-3's own backward main kernel, counted in its compiled SASS (not measured:
# scripts/fa3_bwd_sass.py on the nvdisasm listings in scripts/fa3_sass/, FA3's hopper/ at commit 0251105a
# built for sm_90a by nvcc 13.0 with its flags; its wheels use ptxas 12.8): a main-loop iteration's warp
# instructions, the 8 consumer warps' (the fast path of each pipeline wait) and the producer's and dQ
# writer's (each loop unrolled 2x: two iterations' over 2), over the kBlockM x kBlockN tile, by (head
# dim, causal): 705, 669 (the unmasked loop; the diagonal's masked one runs 776), 506 and 482 a consumer
# warp on 128 x 128, 128 x 128, 80 x 128 and 64 x 128 tiles. Of a consumer's, 4 FP32 instructions a score
# per thread (FFMA, MUFU.EX2, FADD, FMUL: the four FA3's FP32 counting has) and as many FSEL and F2FP;
# the rest HGMMA, warpgroup arrives, shared-memory stores, shuffles and address arithmetic. Issued as
# cudnn-sm90's measured count is (0.57-0.70 a score: cuDNN's kernel issues more); other head dims keep
# the FP32 counting.
FA3_BWD_INSTRUCTIONS_PER_SCORE = {(64, False): (2 * 705 * 8 + 105 + 80) / (2 * 128 * 128),
                                  (64, True): (2 * 669 * 8 + 123 + 80) / (2 * 128 * 128),
                                  (128, False): (2 * 506 * 8 + 132 + 80) / (2 * 80 * 128),
                                  (128, True): (2 * 482 * 8 + 150 + 80) / (2 * 64 * 128)}
# How many times cuDNN's sm90 backward computes S = Q K^T and dP = dO V^T a step, from the same Nsight
# runs: its tensor ops (sm__ops_path_tensor_op_hgmma_src_fp16_sparsity_off.sum) are 10 N^2 d a
# batch-head at head dims 64 and 128, the five GEMMs of FA3's step (4 for S and dP, 2 for dV, 4 for
# dK and dQ), and 14 N^2 d at 256 (knob 64x64x256): S and dP twice, the tensor pipe busy 0.907
# SM-cycles a score, 14 x 256 / 4096 FLOPs a cycle = 0.875 (h200-ncu-cudnn-bwd.json)
CUDNN_BWD_SDP_PASSES = {256: 2}
FA3_STAGES = 2               # kStages on sm90 (flash_fwd_launch_template.h line 47)
MAX_HEAD_DIM = 256           # the largest head dim FA3's sm90 kernels are built for
REGISTERS_PER_SM = 65_536    # with MinBlocksPerMultiprocessor = 1 the compiler may give a thread this / threads


@dataclass(frozen=True)
class Flash3Blocks:
    """flash3's mapping: the forward's block_q x block_kv, the backward's, the K/V ring's stages,
    each a number or "auto" (the FA3 kernel's own choice); pv_in_registers: whether the forward's
    P V GEMM takes P from registers (MmaPV_is_RS) or from shared memory, true, false or "auto"
    (the kernel's rule, fa3_forward_tiles); lpt_order: whether both passes take their tiles in FA3's
    causal order (flash3.lpt_tile, lpt_bwd_tile: longest first, batch-heads in L2 sections), true,
    false or "auto"
    (FA3's kernels under a causal mask: DynamicPersistentTileScheduler; cuDNN's order is not known:
    the grid's); q_tile_rows: the rows the forward's tile computes, in warpgroups
    of 64 ("auto": the kernel's kBlockM before the sequence clipped it, so that a last block's rows
    past seq_len_q are computed as FA3's warpgroups compute them: flash3.flash3_forward; for
    cudnn-sm90 a warpgroup's 64, cuDNN's tiles not being FA3's; a block computes its own rows
    where they are more); pack_gqa: the query heads that share a K/V head as the rows of one tile
    (FA3's PackGQA, flash3_pack.py; "auto": FA3's rule, fa3_pack_gqa; forward only);
    num_splits: split-KV, each (batch-head, query block) over that many blocks and FA3's combine
    ("auto": FA3's num_splits_heuristic for FA3's own kernels' forward, fa3_num_splits; 1 for
    training and cudnn-sm90). variant "fa3-kernel" (fp16/bf16 as the workload says),
    "fp8" (Q, K, V in e4m3, forward only, O in the workload's dtype) or "cudnn-sm90" (torch's cuDNN
    attention on sm90 as FA3's program with its backward's measured instruction count:
    CUDNN_BWD_INSTRUCTIONS_PER_SCORE)."""
    block_q: int | str = AUTO
    block_kv: int | str = AUTO
    block_q_bwd: int | str = AUTO
    block_kv_bwd: int | str = AUTO
    stages: int | str = AUTO
    pv_in_registers: bool | str = AUTO
    lpt_order: bool | str = AUTO
    variant: str = FA3_KERNEL
    q_tile_rows: int | str = AUTO
    pack_gqa: bool | str = AUTO
    num_splits: int | str = AUTO


def fa3_forward_tiles(head_dim: int, causal: bool, fp8: bool,
                      paged_non_tma: bool = False) -> tuple[int, int, bool, bool]:
    """(kBlockM, kBlockN, MmaPV_is_RS, IntraWGOverlap) of tile_size_fwd_sm90 for headdim = headdim_v,
    no local window, no softcap, V not column-major (hopper/tile_size.h); `paged_non_tma`: a paged
    KV cache read without TMA (PagedKVNonTMA: fa3_paged_tma). MmaPV_is_RS false: P goes through
    shared memory to the P V GEMM (head dim 64 without a mask or paging, 96)."""
    d, paged = head_dim, paged_non_tma
    if not fp8:
        if d <= 64:
            n128 = causal or paged                            # lines 14-26: use_blockN_128
            return 192, 128 if n128 else 192, n128, True
        if d <= 96:
            return 192, 128 if paged else 144, False, True    # line 30
        if d <= 128:
            n128 = causal or paged                            # lines 31-33
            return 128, 128 if n128 else 176, True, True
        if d <= 192:
            return 128, 96 if paged else 112, True, True      # line 37 (headdim_v = d > 128: 112)
        return 128, 80, True, True                            # line 39
    if d <= 64:
        return 192, 160, True, True                           # line 43
    if d <= 96:
        return 192, 128, True, True                           # line 45
    if d <= 128:
        return 128, 160 if paged else 224, True, True         # line 47
    if d <= 192:
        return 128, 160, True, True                           # line 49
    return 128, 128, True, not paged                          # line 51: "PagedKV uses more registers"


def fa3_paged_tma(wl: Workload, fp8: bool) -> bool:
    """Whether FA3 reads a paged cache with TMA (hopper/flash_api.cpp get_pagedkv_tma, commit
    0251105a): when a page holds whole K/V tiles (page_size a multiple of the unpaged kernel's
    kBlockN) and the packed query rows exceed a tile's kBlockM ("when seqlen_q <= kBlockM, we're not
    compute bound, and somehow using TMA is slower"); else the producer warpgroup loads K and V with
    cp.async row by row (PagedKVNonTMA, paged_kv.h), with tiles of its own and PackGQA always.
    `wl` as the forward takes it (forward_workload)."""
    block_m, block_n, _, _ = fa3_forward_tiles(wl.head_dim, wl.causal, fp8)
    return wl.kv_page_size % block_n == 0 and wl.seq_len_q * wl.group_size > block_m


def _non_tma(wl: Workload, m) -> bool:
    """A paged cache read without TMA (PagedKVNonTMA)."""
    return wl.kv_page_size is not None and not fa3_paged_tma(wl, _fp8(m))


def fa3_pingpong(block_q: int, head_dim: int, fp8: bool, intra_wg_overlap: bool) -> bool:
    """UseSchedulerBarrier (mainloop_fwd_sm90_tma_gmma_ws.hpp lines 352-355)."""
    wgs = math.ceil(block_q / WG_ROWS)
    if intra_wg_overlap:
        return wgs >= 2 and (head_dim >= 128 if fp8 else head_dim <= 128)
    return wgs == 2


def fa3_backward_tiles(head_dim: int, causal: bool) -> tuple[int, int, int, int]:
    """(kBlockM, kBlockN, Stages_dO, NumMmaWarpGroups) of the sm90 backward, no softcap, no local
    window (flash3_backward.FA3_BWD_TRAITS: flash_bwd_launch_template.h, hdim64 line 320, hdim96
    line 337, hdim128 lines 351/353, hdim192 line 367, hdim256 line 380)."""
    t = fa3_bwd_traits(head_dim, causal)
    return t.block_q, t.block_kv, t.stages_do, t.warpgroups


def _fp8(m: Flash3Blocks) -> bool:
    return m.variant == FP8


def fa3_pack_gqa(wl: Workload, block_q: int) -> bool:
    """FA3's PackGQA rule (hopper/flash_api.cpp get_pack_gqa, heuristics.h should_pack_gqa, commit
    0251105a): with query heads sharing a K/V head, pack them as rows of one tile when the tile's
    row efficiency unpacked, seqlen_q / round_up(seqlen_q, kBlockM), is below 0.9 of the packed
    one's (seqlen_q x heads per K/V head rows): "PackGQA ... can help if seqlen_q is small or not
    near a multiple of kBlockM" (a decode step, a few speculative tokens, a short chunk). The
    efficiencies are float32, as in the source."""
    if wl.kv_heads == wl.heads:
        return False
    nq, ratio = wl.seq_len_q, wl.group_size
    round_up = lambda a, b: -(-a // b) * b
    nopack = np.float32(nq) / np.float32(round_up(nq, block_q))
    pack = np.float32(nq * ratio) / np.float32(round_up(nq * ratio, block_q))
    return bool(float(nopack) < 0.9 * float(pack))


FA3_MAX_SPLITS = 128          # get_num_splits' max_splits (flash_api.cpp)
FA3_SPLITS_LIMIT = 256        # "num_splits > 256 not supported" (mha_fwd)
FA3_SPLIT_L2_BYTES = 50 * 1024 * 1024    # num_splits_heuristic's "we assume that L2 size is 50MB"


def fa3_num_splits(wl: Workload, block_q: int, block_kv: int, sm_count: int, fp8: bool,
                   long_kv: bool = True) -> int:
    """FA3's split count (hopper/flash_api.cpp get_num_splits, heuristics.h num_splits_heuristic,
    commit 0251105a), for the kernel's kBlockM x kBlockN and the query heads packed as Split packs
    them: total_mblocks = batch x kv_heads x ceil(Nq x heads / kv_heads / kBlockM). Enough to fill
    0.8 of the SMs: 1, unless one K/V head (Nk x 2d x element size) exceeds 50 MB with 2 x SMs query
    blocks or more and no causal mask (then the 50 MB pieces); 4 K/V blocks or fewer: 1; else the
    fewest splits whose wave efficiency (n_waves / ceil(n_waves)) is 0.85 of the best, up to 128.
    `long_kv` false: the 50 MB branch is not taken (1 split there; see _resolve_splits)."""
    ratio = wl.heads // wl.kv_heads
    num_n_blocks = math.ceil(wl.seq_len_kv / block_kv)
    num_m_blocks = math.ceil(wl.seq_len_q * ratio / block_q)
    size_one_kv_head = wl.seq_len_kv * 2 * wl.head_dim * (1 if fp8 else 2)
    total_mblocks = wl.batch * wl.kv_heads * num_m_blocks
    if total_mblocks >= 0.8 * sm_count:
        if long_kv and size_one_kv_head > FA3_SPLIT_L2_BYTES and num_m_blocks >= 2 * sm_count and not wl.causal:
            return min(-(-size_one_kv_head // FA3_SPLIT_L2_BYTES), FA3_MAX_SPLITS)
        return 1
    if num_n_blocks <= 4:
        return 1
    return fewest_splits(total_mblocks, sm_count, list(range(1, min(FA3_MAX_SPLITS, sm_count, num_n_blocks) + 1)))


def _resolve_splits(gpu, wl: Workload, m: Flash3Blocks, training: bool, block_q: int, block_kv: int,
                    notes: list) -> int:
    """num_splits resolved: "auto" FA3's rule for FA3's own kernels' forward (1 for training and for
    cudnn-sm90, whose rule is not known; 1, with a note, where its partial outputs would not fit the
    HBM), but for its branch that splits a long prefill's K/V heads over 50 MB (non-causal, 2 x SMs
    query blocks): there a split moved the predicted time by 0.2% (H100, 32 heads, head dim 128,
    N = 131072 and 262144: 2 and 3 splits) while its blocks, alike only a batch-head apart (2,048 and
    6,144 blocks), kept fast mode from folding before 8 of them (37 and 400 CPU-s against 3 and 5),
    so "auto" keeps 1 there, with a note; a number runs it. A number: 1..256 (one line otherwise),
    forward only."""
    ns = m.num_splits
    if ns == AUTO:
        ns = 1 if training or m.variant == CUDNN else fa3_num_splits(wl, block_q, block_kv, gpu.sm_count, _fp8(m),
                                                                     long_kv=False)
        if ns == 1 and not training and m.variant != CUDNN:
            fa3 = fa3_num_splits(wl, block_q, block_kv, gpu.sm_count, _fp8(m))
            if fa3 > 1:
                notes.append(f"num_splits: FA3 splits this long prefill's K/V heads in {fa3} (over 50 MB each); "
                             "simulated in 1 (0.2% off, far faster: set num_splits to run FA3's)")
        # the splits' fp32 partial O and lse (num_splits x batch-heads x Nq x (d + 1) x 4 B) beside Q and O
        # (batch-heads x Nq x d each) and K and V (K/V batch-heads x Nk x d each): where FA3's rule would
        # not fit the GPU's HBM (FA3 itself would run out of memory), one split
        need = ns * wl.groups * wl.seq_len_q * (wl.head_dim + 1) * 4 \
            + 2 * (wl.groups * wl.seq_len_q + wl.kv_groups * wl.seq_len_kv) * wl.head_dim * wl.itemsize
        if ns > 1 and need > gpu.hbm_capacity_bytes:
            notes.append(f"num_splits: FA3's rule picks {ns}, whose fp32 partial outputs do not fit "
                         f"hbm_capacity_bytes = {gpu.hbm_capacity_bytes} (FA3 would run out of memory): 1 split")
            ns = 1
        return ns
    if ns > FA3_SPLITS_LIMIT:
        raise HbmsimError(f"flash3: num_splits = {ns} is more than FA3 allows ({FA3_SPLITS_LIMIT})")
    if ns > 1 and training:
        raise HbmsimError("flash3: split-KV is forward-only in FA3: run the forward pass alone, or num_splits = 1")
    return ns


def _resolve_pack(wl: Workload, m: Flash3Blocks, training: bool, kernel_block_q: int, splits: int = 1,
                  notes: list | None = None) -> bool:
    """pack_gqa resolved: "auto" FA3's rule for a forward; true needs query heads sharing a K/V head
    (one line otherwise); false: each query head its own tiles. FA3 packs a split forward and a
    paged cache read without TMA whatever it is asked (run_mha_fwd: "PackGQA = PackGQA_ || Arch <
    90 || PagedKVNonTMA || Split"), so there false is overridden, with a note."""
    if m.pack_gqa not in (True, False, AUTO):
        raise HbmsimError(f"flash3: pack_gqa = {m.pack_gqa!r} must be true, false or \"auto\"")
    if m.pack_gqa is True:
        if training:
            raise HbmsimError("flash3: pack_gqa packs a forward's query heads (FA3's PackGQA): run the forward "
                              "pass alone, or set pack_gqa = false")
        if wl.kv_heads == wl.heads:
            raise HbmsimError(f"flash3: pack_gqa = true needs query heads sharing a K/V head (heads = {wl.heads}, "
                              f"kv_heads = {wl.kv_heads})")
        return True
    # (FA3's rule for FA3's kernels; cuDNN's is not known: unpacked)
    forced = "split-KV" if splits > 1 else "a paged cache read without TMA" if _non_tma(wl, m) else None
    if forced and not training and wl.kv_heads < wl.heads:
        if m.pack_gqa is False and notes is not None:
            notes.append(f"pack_gqa = false: FA3 packs the query heads of {forced} whatever it is asked (PackGQA)")
        return True
    return m.pack_gqa == AUTO and not training and m.variant != CUDNN and fa3_pack_gqa(wl, kernel_block_q)


def forward_workload(wl: Workload, m: Flash3Blocks, training: bool) -> Workload:
    """The workload as FA3's forward takes it (hopper/flash_api.cpp mha_fwd, "causal=true is the
    same as causal=false in this case"): one query row under the causal mask sees every key, and
    FA3 runs it unmasked, with the unmasked kernel's tiles (e.g. 192 keys at head dim 64, not 128)
    and no causal tile order; except at head dims 65-128 with a paged cache ("we want causal to have
    kBlockN=128, better for pagedKV and TMA"). FA3's own kernels, forward-only runs; the bytes and
    the output are the same either way."""
    keep = wl.kv_page_size is not None and 64 < wl.head_dim <= 128
    if training or m.variant == CUDNN or not wl.causal or wl.seq_len_q != 1 or keep:
        return wl
    return replace(wl, causal=False)


def _resolve(gpu, wl: Workload, m: Flash3Blocks, training: bool) -> tuple:
    if wl.head_dim > MAX_HEAD_DIM:
        raise HbmsimError(f"flash3: field 'head_dim' = {wl.head_dim} must be at most {MAX_HEAD_DIM} (FA3's sm90 "
                          "kernels go up to 256)")
    if wl.dropout > 0 or wl.key_padding_mask:
        raise HbmsimError("flash3: FlashAttention-3 has no dropout and no key-padding mask: set dropout = 0 and "
                          "key_padding_mask = false")
    if _fp8(m) and training:
        raise HbmsimError("flash3: variant 'fp8' is forward only (FA3 has no FP8 backward): passes = [\"forward\"]")
    notes: list = []
    wl = forward_workload(wl, m, training)
    if wl.kv_page_size is not None and (training or m.variant == CUDNN):
        raise HbmsimError(f"flash3: kv_page_size = {wl.kv_page_size}: " + (
            "FA3 pages the KV cache of its forward only (mha_bwd takes no page_table): passes = [\"forward\"]"
            if training else "variant cudnn-sm90 has no paged KV cache here (torch's SDPA takes contiguous K/V)"))
    bq, bkv, pv_rs, _ = fa3_forward_tiles(wl.head_dim, wl.causal, _fp8(m), _non_tma(wl, m))
    bq_b, bkv_b, _, _ = fa3_backward_tiles(wl.head_dim, wl.causal)
    splits = _resolve_splits(gpu, wl, m, training, bq, bkv, notes)
    pack = _resolve_pack(wl, m, training, bq, splits, notes)
    # the forward's tiles are of the packed rows (seq_len_q x heads a K/V head) where it packs
    lengths = {"seq_len_q": _pack(wl, pack).rows, "seq_len_kv": wl.seq_len_kv}
    lengths_bwd = {"seq_len_q": wl.seq_len_q, "seq_len_kv": wl.seq_len_kv}
    out = {"pack_gqa": pack, "num_splits": splits, "stages": FA3_STAGES if m.stages == AUTO else m.stages,
           "pv_in_registers": pv_rs if m.pv_in_registers == AUTO else m.pv_in_registers,
           # (FA3's split forward is not persistent: no causal order there)
           "lpt_order": (wl.causal and m.variant != CUDNN and splits == 1) if m.lpt_order == AUTO else m.lpt_order}
    for key, kernel, seq_field in (("block_q", bq, "seq_len_q"), ("block_kv", bkv, "seq_len_kv"),
                                   ("block_q_bwd", bq_b, "seq_len_q"), ("block_kv_bwd", bkv_b, "seq_len_kv")):
        value, seq = getattr(m, key), (lengths_bwd if key.endswith("_bwd") else lengths)[seq_field]
        if value == AUTO:
            value = min(kernel, seq)       # clipped to the sequence: the same bytes, less SRAM
        elif value > seq:
            notes.append(f"{key} = {value} is longer than {seq_field} = {seq}: clamped to {seq}")
            value = seq
        out[key] = value
    out["q_tile_rows"] = _q_tile_rows(m, bq if m.block_q == AUTO else m.block_q, out["block_q"])
    if m.variant == CUDNN and m.q_tile_rows == AUTO:
        # cuDNN's own tile: a warpgroup's 64 rows (WG_ROWS), not FA3's kBlockM: cuDNN 9.19's sm90
        # fprop runs a producer and two consumer warpgroups (384 threads, Nsight's launch__block_size:
        # h100-ncu-hopper.json, h200-ncu-hopper.json), each on a 64-row x 128-key wgmma tile (the
        # kernel's name, ..._fprop_wgmma_f16_knob_7_64x128xD_4x1x1)
        out["q_tile_rows"] = min(WG_ROWS, out["block_q"])
    m = replace(m, **out)
    if m.variant == CUDNN and training and wl.head_dim not in CUDNN_BWD_INSTRUCTIONS_PER_SCORE:
        notes.append(f"variant cudnn-sm90: head_dim = {wl.head_dim} has no measured instruction count (measured: "
                     f"{', '.join(map(str, CUDNN_BWD_INSTRUCTIONS_PER_SCORE))}); its backward counts FA3's operations")
    need = _sram_bytes(wl, m, training)
    if need > gpu.sram_bytes_per_sm:
        raise HbmsimError(f"flash3: blocks {m.block_q}x{m.block_kv} (bwd {m.block_q_bwd}x{m.block_kv_bwd}), "
                          f"{m.stages} stages need {need} B of shared memory per block, more than "
                          f"sram_bytes_per_sm = {gpu.sram_bytes_per_sm} of '{gpu.name}'")
    return m, tuple(notes)


def _q_tile_rows(m: Flash3Blocks, unclipped: int, block_q: int) -> int:
    """The resolved q_tile_rows: the user's (a block computes at least that many rows, and its own),
    else the tile before the sequence clipped it (`unclipped`: the kernel's kBlockM, or the block_q
    the user gave)."""
    if m.q_tile_rows != AUTO:
        return m.q_tile_rows
    return max(block_q, unclipped)


def _registers(block_q: int) -> int:
    """Registers per thread at launch: 65,536 / threads, rounded down to 8 (one block an SM)."""
    threads = 128 * (math.ceil(block_q / WG_ROWS) + 1)
    return REGISTERS_PER_SM // threads // 8 * 8


def _pack(wl: Workload, pack) -> PackGQA:
    """The forward's rows: the group's query heads packed (pack true) or not."""
    return PackGQA(wl, wl.group_size if pack is True else 1)


def _fwd_step(wl: Workload, m: Flash3Blocks, training: bool = False) -> int:
    """K/V tiles a fast-mode forward step covers at most (common.fwd_tiles_per_step: the longest
    loop, in the launch's grid of batch-heads x query blocks, packed or not)."""
    pk = _pack(wl, m.pack_gqa and not training)
    return fwd_tiles_per_step(wl, m.block_q, m.block_kv, pk.groups * pk.blocks(m.block_q))


def _bwd_instructions_per_score(wl: Workload, variant: str) -> float:
    """The backward main kernel's warp instructions a score the variant issues (cudnn-sm90: Nsight's,
    fa3-kernel: its SASS's, by head dim); 0.0 where none is counted: FA3's FP32 counting."""
    if variant == CUDNN:
        return CUDNN_BWD_INSTRUCTIONS_PER_SCORE.get(wl.head_dim, 0.0)
    return FA3_BWD_INSTRUCTIONS_PER_SCORE.get((wl.head_dim, wl.causal), 0.0) if variant == FA3_KERNEL else 0.0


def _build(wl: Workload, m: Flash3Blocks, data: AttentionData | None, training: bool, fast: bool = False) -> Program:
    wl = forward_workload(wl, m, training)
    fp8 = _fp8(m)
    _, _, _, overlap = fa3_forward_tiles(wl.head_dim, wl.causal, fp8, _non_tma(wl, m) and not training)
    pv_is_rs = m.pv_in_registers
    tile_rows = 0 if m.q_tile_rows == AUTO else m.q_tile_rows     # (0: a mapping built unresolved)
    pingpong = fa3_pingpong(max(m.block_q, tile_rows), wl.head_dim, fp8, overlap)    # the kernel's warpgroups
    fwd_step = _fwd_step(wl, m, training) if fast else 1
    registers = _registers(max(m.block_q, tile_rows))
    # FA3's kernels compute whole tiles at the sequence's ends; cuDNN's tiles (64 x 128 a warpgroup)
    # are not FA3's: the real keys, and rows in warpgroups of 64 (q_tile_rows)
    whole = m.variant != CUDNN
    if training:
        _, _, stages_do, wgs_bwd = fa3_backward_tiles(wl.head_dim, wl.causal)
        bwd_step = bwd_tiles_per_step(wl, m.block_q_bwd, m.block_kv_bwd) if fast else 1
        instructions = _bwd_instructions_per_score(wl, m.variant)
        sdp_passes = CUDNN_BWD_SDP_PASSES.get(wl.head_dim, 1) if m.variant == CUDNN else 1
        return flash3_training(wl, m.block_q, m.block_kv, data, (m.block_q_bwd, m.block_kv_bwd), m.stages,
                               overlap, pingpong, stages_do, wgs_bwd, (fwd_step, bwd_step), registers,
                               pv_is_rs, instructions, m.lpt_order, tile_rows, whole, sdp_passes)
    splits = 1 if m.num_splits == AUTO else m.num_splits       # (a mapping built unresolved: none)
    return flash3_forward(wl, m.block_q, m.block_kv, data, m.stages, overlap, pingpong, fp8, fwd_step,
                          registers, pv_is_rs, m.lpt_order, tile_rows, whole, splits, _pack(wl, m.pack_gqa).ratio)


def _io(wl: Workload, m: Flash3Blocks, pass_name: str) -> dict:
    if pass_name == "forward":
        pack = _pack(wl, m.pack_gqa).ratio
        if m.num_splits not in (1, AUTO):
            return flash3_splitkv_io(wl, m.block_q, m.block_kv, m.num_splits, _fp8(m), pack)
        return flash3_forward_io(wl, m.block_q, m.block_kv, _fp8(m), pack)
    return flash3_backward_io(wl, m.block_q_bwd, m.block_kv_bwd)


def flash3_splitkv_io(wl: Workload, block_q: int, block_kv: int, num_splits: int, fp8: bool, pack: int = 1) -> dict:
    """{tensor: (read, write)} of a split forward and FA3's combine on `wl`, `pack` query heads packed
    a tile (PackGQA): flash2_splitkv_io's, the same reads and writes (Q once a block, each split's K/V
    share, an fp32 partial O and lse a split, the combine reading them and writing O and lse), with
    Q, K, V in e4m3 for FP8, and every split's lse read once more by each further column block of
    the combine (kBlockK: flash3_combine.combine_tile)."""
    io = dict(flash2_splitkv_io(wl, block_q, block_kv, num_splits, pack=pack))
    if fp8:                    # Q, K, V at 1 byte an element, not the workload's
        io.update({n: (io[n][0] // wl.itemsize, io[n][1]) for n in ("Q", "K", "V")})
    k_blocks = math.ceil(wl.head_dim / combine_tile(wl.head_dim)[1])
    r, w = io["lse_accum"]
    io["lse_accum"] = (r + (k_blocks - 1) * wl.groups * wl.seq_len_q * 4 * num_splits, w)
    return io


def _sram_bytes(wl: Workload, m: Flash3Blocks, training: bool) -> int:
    fwd = flash3_sram_bytes(wl, m.block_q, m.block_kv, m.stages, _fp8(m), m.pv_in_registers)
    if not training:
        return fwd
    _, _, stages_do, _ = fa3_backward_tiles(wl.head_dim, wl.causal)
    return max(fwd, flash3_bwd_sram_bytes(wl, m.block_q_bwd, m.block_kv_bwd, stages_do))


def _steps(wl: Workload, m: Flash3Blocks, training: bool, fast: bool = False) -> int:
    c = math.ceil
    pk = _pack(wl, m.pack_gqa and not training)              # the forward's blocks, packed or not
    if not training and m.num_splits not in (1, AUTO):       # a split's share of the K/V tiles, and the combine
        per = c(c(wl.seq_len_kv / m.block_kv) / m.num_splits)
        return pk.groups * pk.blocks(m.block_q) * m.num_splits * per + combine_blocks(wl, wl.head_dim)
    kv_tiles = c(wl.seq_len_kv / m.block_kv)
    steps = pk.groups * pk.blocks(m.block_q) * c(kv_tiles / (_fwd_step(wl, m, training) if fast else 1))
    if training:
        q_tiles = c(wl.seq_len_q / m.block_q_bwd)
        q_step = bwd_tiles_per_step(wl, m.block_q_bwd, m.block_kv_bwd) if fast else 1
        steps += 2 * wl.groups * c(wl.seq_len_kv / m.block_kv_bwd) * c(q_tiles / q_step)
    return steps


def _describe(m: Flash3Blocks) -> str:
    text = f"{m.block_q}x{m.block_kv}"
    if (m.block_q_bwd, m.block_kv_bwd) != (m.block_q, m.block_kv):
        text += f" bwd {m.block_q_bwd}x{m.block_kv_bwd}"
    return text + f" {m.stages}st" + (" fp8" if _fp8(m) else "") + (" cudnn" if m.variant == CUDNN else "") \
        + (" P-smem" if m.pv_in_registers is False else "") + (" lpt" if m.lpt_order is True else "") \
        + (" packed" if m.pack_gqa is True else "") \
        + (f" split{m.num_splits}" if m.num_splits not in (1, AUTO) else "")


SPEC = register(AlgorithmSpec(
    name="flash3", label="FlashAttention-3 (Shah et al. 2024)", mapping_type=Flash3Blocks,
    build=_build, io=_io, sram_bytes=_sram_bytes, resolve=_resolve, steps=_steps, describe=_describe,
    auto_fields=("block_q", "block_kv", "block_q_bwd", "block_kv_bwd", "stages", "q_tile_rows", "num_splits"),
    bool_fields=("pv_in_registers", "lpt_order", "pack_gqa"),
    variants=(FA3_KERNEL, FP8, CUDNN), match_fields=("block_q", "block_kv"), coarsens=True, needs_wgmma=True,
    paged_kv=True,
    no_kernel_reason="this project has no FA3 kernel of its own (FA3 needs sm90: Dao-AILab/flash-attention hopper/)"))
