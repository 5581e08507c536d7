"""FlashAttention v1 as the CUDA *kernel* organises it (flash-attention v1.0.9, the `fmha_*`
kernels the FlashAttention-2 paper timed), not as the paper's Algorithm 1/4 (see flash1.py).

Ground truth: spec8 section 1 (sources: `csrc/flash_attn/src/fmha_fprop_kernel_1xN.h`,
`fmha_dgrad_kernel_1xN_loop.h`, `fmha_fwd_launch_template.h`, `fmha_bwd_launch_template.h`,
`fmha_api.cpp` at tag v1.0.9).

Forward (`fmha_fwd_loop_kernel`, grid (b, h, num_splits), blockIdx.z = split, slowest):
  one block per (batch-head, split z); outer loop over key blocks j of Bc keys (K_j, V_j read
  once per block and key block), inner loop over the 16-row query steps i = z, z+S, ... from
  the first step that can see block j. Per (j, i): read Q_i (every j), for j > 0 the fp32
  o_tmp_i and fp32 lse_i; write lse_i (every j) and either the final O_i (storage dtype) or the
  fp32 o_tmp_i. So unlike FA2 the running output goes to HBM in fp32 once per key block.
Backward (flash1_kernel_backward.py): non-parallel (`compute_dq_dk_dv_1xN`, one block per
  batch-head) or seq-parallel (zero dq_tmp, dot_do_o, one block per (batch-head, key block) with
  fp32 atomics into dq_tmp, then dq_tmp -> dQ), chosen by `fa1_bwd_parallel`
  (num_splits_heuristic_bwd).

Masks. Our causal mask is bottom-right aligned; the kernel's is top-left (it only ran with
Nq = Nk, where both agree). Its "key block j starts at query step j*Bc/16" generalises to
"the first 16-row step that can see key j*Bc" (causal_first_q_block with block 16); for j = 0
it is 0 as in the kernel, so every row gets O and lse written even when (Nq > Nk, bottom-right)
a row sees no key. Its causal final-write test `i*16 < (j+1)*Bc` generalises to "step i is
before the first step of key block j+1", which is the same thing for Nq = Nk. Key padding is
a mask on the full Nk keys (as in the other programs) with kv_lens read once per block: the
real v1 kernel handles padding by unpadding (varlen cu_seqlens), which this model does not do.
Dropout regenerates its mask in-kernel (Philox): no mask bytes.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from hbmsim.simulator import HbmsimError, Launch, Program
from hbmsim.simulator.machine import Machine
from hbmsim.simulator.time_model import MMA_SYNC

from .common import (STATS_DTYPE, input_tensors, load_kv_len, masked_scores, online_softmax_update,
                     online_softmax_vector_flops, output, scaled_keep_mask)
from .workload import AttentionData, Workload, causal_first_q_block

QUERY_STEP = 16          # Cta_tile_p::M = STEP = 16 in every v1.0.9 fwd and bwd config
DOT_DO_O_ROWS = 128      # fmha_bwd_dot_do_o_kernel grid (b, h, ceil(Nq/128)), fmha_bwd_launch_template.h:106
# The forward's warps split the key block (FMHA_kernel_traits<S, D, 16, WARPS_M = 1, WARPS_N = 4, ...>
# in every v1.0.9 fwd config): each warp holds a partial output over its keys, and the warps add
# them up through shared memory (the FlashAttention-2 paper, section 3.3, names this "split-K"
# scheme as what slows FlashAttention's forward down). Sets SRAM reads only, never traffic.
FWD_WARPS_N = 4
# The backward's warps split the key block the same way (FMHA_kernel_traits<S, D, 16, 1, WARPS_N = 8, ...>
# in every v1.0.9 bwd config): every warp reads all of Q_i and dO_i, and each warp's partial
# dQ_i = dS K (over its keys) is added up through shared memory (smem_dq = 16 x d x 4 x WARPS_N).
BWD_WARPS_N = 8
FWD_THREADS, BWD_THREADS = 32 * FWD_WARPS_N, 32 * BWD_WARPS_N      # Kernel_traits::THREADS
# Registers a thread of the v1.0.9 kernels as compiled, by (dispatched head dim, Bc): `ptxas -v` of
# fmha_{fwd,bwd}_hdim{32,64,128}.cu at tag v1.0.9 for sm_80 with CUDA 13.0 and the setup.py's
# flags (`python scripts/fa1_registers.py CHECKOUT` reproduces the table; sm_90 within a few), the
# largest over the instantiations the FA2 paper's runs use (fp16, no dropout, no softmax returned;
# causal or not, and the backward's loop-steps and seq-parallel kernels). The paper's builds used
# an older CUDA; the kernels at 255 are at the per-thread cap. What
# cudaOccupancyMaxActiveBlocksPerMultiprocessor counts for the num_splits heuristics
# (fmha_fwd_launch_template.h:74-79, fmha_bwd_launch_template.h:89-96) and what the `registers`
# effect holds an SM to: 2 forward blocks an SM at head dims 64 and 128 (shared memory alone
# would give A100 4), 1 backward block.
FWD_REGISTERS = {(32, 128): 136, (32, 256): 180, (64, 128): 168, (64, 256): 255, (128, 128): 255}
BWD_REGISTERS = {(32, 128): 185, (32, 256): 245, (64, 128): 224, (64, 256): 255, (128, 128): 255}
DOT_DO_O_REGISTERS = 30           # fmha_bwd_dot_do_o_kernel, every head dim and Bc (ptxas, as above)


# ---- configuration ------------------------------------------------------------------------------

def fa1_kernel_blocks(wl: Workload) -> int:
    """Key block Bc (Cta_tile_p::N) of the v1.0.9 forward (fmha_fwd_hdim{32,64,128}.cu): 256
    for d <= 64 unless the (rounded) seqlen_k is 128, 128 for 64 < d <= 128. The backward makes
    the same choice on sm80/sm90 (spec 1.4; the sm75 row is not modelled)."""
    d = wl.head_dim
    if d > 128:
        raise HbmsimError(f"flash1_kernel: head_dim {d} > 128 is not supported by FlashAttention v1")
    if d > 64:
        return 128
    return 128 if wl.seq_len_kv <= 128 else 256      # max_seqlen_k rounds to 128 when <= 128


def query_step_rows(i: int, nq: int) -> slice:
    """The rows of 16-row query step i of nq rows (the last may be shorter)."""
    return slice(i * QUERY_STEP, min(nq, (i + 1) * QUERY_STEP))


def fa1_registers(wl: Workload, block_kv: int, backward: bool) -> int:
    """Registers a thread of the kernel fmha_api.cpp dispatches (head dims up to 32, 64 and 128)
    for Bc = block_kv: FWD_REGISTERS / BWD_REGISTERS; 0 (not known) for another Bc."""
    hdim = 32 if wl.head_dim <= 32 else 64 if wl.head_dim <= 64 else 128
    return (BWD_REGISTERS if backward else FWD_REGISTERS).get((hdim, block_kv), 0)


def fa1_ctas_per_sm(gpu, wl: Workload, block_kv: int, backward: bool) -> int:
    """What cudaOccupancyMaxActiveBlocksPerMultiprocessor gives the heuristics: the blocks of the
    kernel an SM holds (the machine's rule: block limit, shared memory, the training kernel's for
    the backward, and registers); 1 for a block too large, which check_program then refuses."""
    kernel = Launch("fa1_bwd" if backward else "fa1_fwd", 1, fa1_kernel_sram_bytes(wl, block_kv, backward), None,
                    threads_per_block=BWD_THREADS if backward else FWD_THREADS,
                    registers_per_thread=fa1_registers(wl, block_kv, backward))
    try:
        return max(1, Machine.slots_per_sm_of(gpu, kernel))
    except HbmsimError:
        return 1


def _eff(n_waves: np.float32) -> np.float32:
    return np.float32(n_waves / np.float32(math.ceil(n_waves)))


def fa1_num_splits(groups: int, sm_count: int, ctas_per_sm: int, seq_len_q: int) -> int:
    """num_splits_heuristic_fwd (fmha_fwd_launch_template.h:21-39), in float32 as the C++ does:
    the smallest split count whose wave efficiency exceeds 0.95 of the best, over 1..max_splits."""
    m = QUERY_STEP
    seqlen_q = -(-seq_len_q // m) * m      # fmha_api.cpp:255-264 rounds max_seqlen_q up to 16
    # The v1.0.9 bug (fmha_fwd_launch_template.h:82): `std::min(30, (seqlen_q + M - 1 / M))`;
    # `1 / M` is integer 0, so max_splits = min(30, seqlen_q + 16) -- 30 for any realistic seqlen
    # -- instead of the intended min(30, ceil(seqlen_q / M)). Python's `1 // m` reproduces it.
    max_splits = min(30, seqlen_q + m - 1 // m)
    denom = np.float32(sm_count * ctas_per_sm)
    effs = [_eff(np.float32(groups * n) / denom) for n in range(1, max_splits + 1)]
    best = max(effs)
    for n, itemsize in enumerate(effs, start=1):
        if float(itemsize) > 0.95 * float(best):      # 0.95 is a double literal: the compare is in double
            return n
    return 1


def fa1_bwd_parallel(groups: int, sm_count: int, ctas_per_sm: int, seq_len_kv: int, block_kv: int,
                     causal: bool) -> bool:
    """num_splits_heuristic_bwd (fmha_bwd_launch_template.h:12-29) returns 1 or seqlen_k/Bc;
    True when it picks the seq-parallel kernel (more than one split). seqlen_k is the rounded
    max_seqlen_k (fmha_api.cpp rounding: 128 if <= 128, 256 if <= 256, else a multiple of Bc)."""
    if seq_len_kv <= 128:
        seqlen = 128
    elif seq_len_kv <= 256:
        seqlen = 256
    else:
        seqlen = -(-seq_len_kv // block_kv) * block_kv
    denom = np.float32(sm_count * ctas_per_sm)
    eff_1 = _eff(np.float32(groups) / denom)
    n_par = seqlen // block_kv                      # C++ integer division
    if n_par <= 1:
        return False
    eff_par_raw = _eff(np.float32(groups * n_par) / denom)
    if not causal:
        discount = np.float32(1.0) + np.float32(block_kv) / np.float32(seqlen)
    else:
        if n_par >= 10:                              # "seqlen >= 1280 always prefers parallel" (d=128)
            return True
        discount = np.float32(1.0 + 0.5 * float(np.float32(block_kv) / np.float32(seqlen)))
    eff_par = np.float32(eff_par_raw / discount)
    return not (eff_1 >= eff_par)                    # `eff_1 >= eff_parallel ? 1 : num_splits_parallel`


def _v_in_regs(wl: Workload, block_kv: int) -> bool:
    """Backward traits flag 0x100 (V *not* in registers) on sm80/sm90: d in 65..128, and d in
    33..64 with Bc = 256 (spec 1.4 table); other configs use 0x08 (V in registers)."""
    d = wl.head_dim
    return not (d > 64 or (d > 32 and block_kv == 256))


def fa1_kernel_sram_bytes(wl: Workload, block_kv: int, training: bool) -> int:
    """Shared memory of one block, after kernel_traits.h / the launch templates (v1.0.9).

    Forward: BYTES_PER_SMEM = max(Q + K, Q + O) (K and V share one buffer: FLAGS 0x08, so
    BYTES_PER_SMEM_V = 0), with Smem_tile_q double-buffered (2 x 16 x d), one Bc x d K/V buffer,
    and Smem_tile_o = 16 rows x d fp32; plus Smem_dp_sum (2 x 16 fp32, the lse tile) when there
    is more than one key block (fmha_fwd_launch_template.h:51-54).
    Backward (fmha_bwd_launch_template.h): smem_q * 2 + smem_v * (V_IN_REGS ? 1 : 2) + smem_dq
    + smem_s * 2 with smem_q = 2 x 16 x d (double-buffered), smem_v = Bc x d,
    smem_dq = 16 x d x 4 x WARPS_N (8), smem_s = 16 x Bc x 2 (asserted in the source).
    Assumptions: element size = the storage dtype (fp32 storage is our extension; the kernel is
    fp16/bf16), no swizzle padding, d not rounded up to the dispatched 32/64/128."""
    d, itemsize, m = wl.head_dim, wl.itemsize, QUERY_STEP
    smem_q = 2 * m * d * itemsize
    fwd = max(smem_q + block_kv * d * itemsize, smem_q + m * d * 4)
    if wl.seq_len_kv > block_kv:
        fwd += 2 * m * 4
    if not training:
        return fwd
    smem_v = block_kv * d * itemsize * (1 if _v_in_regs(wl, block_kv) else 2)
    bwd = 2 * smem_q + smem_v + m * d * 4 * 8 + 2 * m * block_kv * 2
    return max(fwd, bwd)


# ---- shared loop geometry -----------------------------------------------------------------------

def _first_step(wl: Workload, c0: int) -> int:
    """First 16-row query step key block starting at c0 visits: 0 for the first block (the
    kernel's begin = j*Bc/16 = 0), else the first step that can see key c0 under the causal
    mask (bottom-right generalisation of j*Bc/16), 0 without it."""
    return 0 if c0 == 0 else causal_first_q_block(wl, c0, QUERY_STEP)


def key_blocks(wl: Workload, block_kv: int) -> list:
    """[(c0, c1, begin, next_begin)]: next_begin is the first step of the next key block, or
    n_steps for the last one, so step i is final at block j iff i < next_begin."""
    nk = wl.seq_len_kv
    n_steps = math.ceil(wl.seq_len_q / QUERY_STEP)
    starts = list(range(0, nk, block_kv))
    begins = [_first_step(wl, c0) for c0 in starts] + [n_steps]
    return [(c0, min(nk, c0 + block_kv), begins[j], min(n_steps, begins[j + 1])) for j, c0 in enumerate(starts)]


# ---- forward --------------------------------------------------------------------------------------

def fa1_kernel_forward(wl: Workload, block_kv: int, num_splits: int, data: AttentionData | None = None) -> Program:
    """The v1.0.9 forward, a block per (batch-head, split). (Its 16-row query steps are not
    coarsened in fast mode: with the loads a step ahead, two to eight steps at once ran within
    0.1-1.6% of the full simulation but hardly faster, the tiles' own bookkeeping being most of
    the cost. Without a mask its key blocks 1 .. n-2 are alike, and fast mode skips a stretch of
    them once every block's are steady: simulator/loop_fold.py.)"""
    if block_kv < 1 or num_splits < 1:
        raise HbmsimError(f"flash1_kernel: block_kv {block_kv} and num_splits {num_splits} must be >= 1")
    g_count, nq, d = wl.groups, wl.seq_len_q, wl.head_dim
    tensors = input_tensors(wl, data)
    Q, K, V = tensors["Q"], tensors["K"], tensors["V"]
    O = output(wl, "O", nq, d, wl.dtype, data)
    LSE = output(wl, "lse", nq, 1, STATS_DTYPE, data)
    kblocks = key_blocks(wl, block_kv)
    loop = len(kblocks) > 1                           # fmha_api.cpp: o_tmp only `if (loop)`
    OT = output(wl, "o_tmp", nq, d, STATS_DTYPE, data) if loop else None
    n_steps = math.ceil(nq / QUERY_STEP)
    scale, itemsize, S = wl.softmax_scale, wl.itemsize, num_splits
    keep = scaled_keep_mask(wl, data)
    numeric = data is not None
    all_cols, one = slice(0, d), slice(0, 1)
    steady = not wl.causal and len(kblocks) > 3
    W = FWD_WARPS_N

    step_rows = [query_step_rows(i, nq) for i in range(n_steps)]

    @functools.cache
    def made_works(n, nc):
        """(S and softmax, partial O, split-K reduction) compute arguments of a step of n query rows
        against nc keys: the same for every step of that shape, so made once."""
        return (
            # S = Q K^T (2*n*nc*d FLOPs) and the online softmax of the n x nc tile, with an exp
            # per score and two per row (the running max's rescales); SRAM: every warp reads
            # all of Q_i (K sits in registers), and the row max and row sum are each reduced
            # across the warps through shared memory (W partials of n fp32 written and read).
            dict(matmul_flops=2 * n * nc * d, vector_flops=online_softmax_vector_flops(wl, n, nc),
                 sram_bytes=W * n * d * itemsize + 2 * (2 * W * n * 4), exp_ops=n * nc + 2 * n),
            # each warp's partial O = P V over its keys (2*n*nc*d FLOPs; V sits in registers)
            dict(matmul_flops=2 * n * nc * d),
            # the split-K reduction, after the GEMM it depends on: the W partial outputs (n x d
            # fp32) written to the fp32 Smem_tile_o and read back, (W-1)*n*d adds, plus 2*n*d
            # to rescale the loaded o_tmp and normalise the output
            dict(vector_flops=(W - 1) * n * d + 2 * n * d, sram_bytes=2 * W * n * d * 4))

    def block(ctx, index):
        z, g = divmod(index, g_count)                 # blockIdx.z (split) is the slowest dimension
        if z >= n_steps:
            return                                    # fmha_fprop_kernel_1xN.h:284: no step for this split
        Qg, LSEg, Og = Q[g], LSE[g], O[g]
        OTg = OT[g] if OT is not None else None

        def step_loads(j, i):
            """What step i reads before its first GEMM: Q_i, and for key blocks after the first lse_i."""
            rows = step_rows[i]
            return ((Qg, rows, all_cols), (LSEg, rows, one)) if j > 0 else ((Qg, rows, all_cols),)
        # key blocks 1 .. n-2 are alike without a mask (each reads the partial output back): in fast
        # mode, once every block's are steady, all skip the same number (simulator/loop_fold.py)
        loop = ctx.steady_loop(1, len(kblocks) - 1) if steady else None
        kv_len = yield from load_kv_len(ctx, tensors, wl, g)
        j = -1
        while j + 1 < len(kblocks):
            j += 1
            if loop is not None:
                j = loop.next(j)
            c0, c1, begin, next_begin = kblocks[j]
            first = begin + (z - begin) % S           # first step >= begin with step = z (mod S)
            if first >= n_steps:
                continue                              # this split has no step here: no K/V load
            nc = c1 - c0
            cols = slice(c0, c1)
            # K_j, V_j and the first step's Q (and, !Is_first, its lse) load together
            # (fmha_fprop_kernel_1xN.h:321-332); each later step's Q (double-buffered in smem) and
            # lse (registers) are loaded during the step before (:403-408, :436-441), and a step's
            # fp32 partial output o_tmp is loaded after its first GEMM and used by its last phase (:401).
            k, v, *ahead = yield from ctx.load_tiles((K[wl.kv_group(g)], cols, all_cols),
                                                     (V[wl.kv_group(g)], cols, all_cols),
                                                     *step_loads(j, first))
            # K_j, V_j go smem -> registers once per key block (K and V held in registers).
            yield from ctx.compute(sram_bytes=2 * nc * d * itemsize)
            nxt = None
            for i in range(first, n_steps, S):
                rows = step_rows[i]
                r0, r1 = rows.start, rows.stop
                n = r1 - r0
                if i > first:
                    ahead = yield from ctx.wait(nxt)
                nxt = ctx.prefetch(*step_loads(j, i + S)) if i + S < n_steps else None
                o_tmp = ctx.prefetch((OTg, rows, all_cols)) if j > 0 else None     # !Is_first
                qk_softmax, pv, reduction = made_works(n, nc)
                yield from ctx.compute_chain(qk_softmax, pv)       # S, its softmax, then P V (made_works)
                (o_prev,) = (yield from ctx.wait(o_tmp)) if o_tmp is not None else (None,)
                yield from ctx.compute(**reduction)                # the split-K reduction (made_works)
                o_new = lse_new = None
                if numeric:
                    q = ahead[0]
                    if j == 0:
                        o_prev, l_prev, m_prev = np.zeros((n, d)), np.zeros(n), np.full(n, -np.inf)
                    else:                             # (o, lse) is the state (o, l = 1, m = lse)
                        m_prev = ahead[1][:, 0]
                        l_prev = np.where(np.isfinite(m_prev), 1.0, 0.0)
                    o_new, l_new, m_new = online_softmax_update(
                        masked_scores(wl, scale, q, k, kv_len, r0, r1, c0, c1), v, o_prev, l_prev, m_prev,
                        None if keep is None else keep[g, r0:r1, c0:c1])
                    lse_new = np.full((n, 1), -np.inf)
                    pos = l_new[:, 0] > 0
                    lse_new[pos, 0] = m_new[pos, 0] + np.log(l_new[pos, 0])
                # is_final_write (fmha_fprop_kernel_1xN.h:620-623): the last key block, or no
                # later key block visits this step (causal).
                final = i < next_begin
                yield from ctx.store_tiles((LSEg, rows, one, lse_new), (Og if final else OTg, rows, all_cols, o_new))

    allocs = (O, LSE) + ((OT,) if loop else ())
    launch = Launch("fa1_fwd", g_count * S, fa1_kernel_sram_bytes(wl, block_kv, False), block,
                    allocs=allocs, frees=(OT,) if loop else (), tensor_op=MMA_SYNC, threads_per_block=FWD_THREADS,
                    registers_per_thread=fa1_registers(wl, block_kv, False))
    return Program("flash1_kernel_forward", [launch], inputs=tuple(tensors.values()), outputs={"O": O, "lse": LSE})
