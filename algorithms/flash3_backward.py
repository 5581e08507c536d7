"""FlashAttention-3 backward as a simulated program, after flash3's forward (fp16/bf16).

FA3's backward runs the kernels FA2's does (hopper/flash_bwd_launch_template.h: the
preprocessing kernel computing D = rowsum(dO o O) and clearing the fp32 dQ accumulator, the main
kernel, the dQ conversion), so the first and last launches here are flash2_backward's, renamed,
over the same tensors: the same bytes (io_flash3.flash3_backward_io). The main kernel is FA3's:
one thread block per (batch-head, K/V block), its warps in roles
- the producer warp loads K_j and V_j once (TMA), then Q_i, dO_i, lse_i and D_i of each query
  block into a ring of Stages_dO slots, reusing a slot once the consumers release it;
- `warpgroups` consumer warpgroups split each (query block, K/V block) step's five GEMMs
  (S = Q K^T, dP = dO V^T, dV += P^T dO, dK += dS^T Q, dQ = dS K: 10 n nc d FLOPs) between them,
  with wgmma, each GEMM's operand reads counted per wgmma instruction by the kernel's tiled MMA
  (BwdTraits, bwd_gemm_operand_bytes). Between the first two GEMMs and the last three, in the order of FA3's bwd_step
  (hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp, commit 0105a8fd): P = exp2(S scale - lse) once S's
  wgmma is waited for (warpgroup_wait<1>); dS = P o (dP - D) once dP's is (warpgroup_wait<0>), a
  second pass over the tile on the FP32 lanes; dS (and P, where the dV GEMM reads P from shared
  memory: Mma_dKV_is_RS false, head dims above 128) converted to 16 bits and stored to shared
  memory (st.shared) before the next GEMM is issued, behind a named barrier of every MMA thread.
  The step's dQ part is staged in shared memory (fp32, while the dK GEMM runs: head dims below
  256, dQacc_use_TMA; the TMA reads it back) and added to the accumulator with one atomic add of
  the tile (FA3: TMA reduce-add) once every warpgroup has finished it.
Numerics (data mode): the step's gradients are computed once, in float64, by the warpgroup that
finishes the step last, as flash2's backward computes them.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from hbmsim.simulator import HbmsimError, Launch, Program
from hbmsim.simulator.time_model import FP32, INSTRUCTIONS, WGMMA

from .backward_common import bwd_ds_flops, bwd_vector_flops, kv_block, recompute_p, tile_grads, unseen_kv_block
from .common import block_rows, row_blocks_period
from .flash2_backward import flash2_backward
from .flash3 import flash3_forward, lpt_bwd_tile, lpt_period
from .workload import AttentionData, Workload, allowed


def flash3_bwd_sram_bytes(wl: Workload, block_q: int, block_kv: int, stages_do: int) -> int:
    # Q_i in 2 ring slots and dO_i in Stages_dO, K_j and V_j once, P and dS (block_q x block_kv)
    # for the GEMMs that read them from shared memory, lse_i and D_i (fp32) with each Q slot
    e, d = wl.itemsize, wl.head_dim
    return (2 * block_q + stages_do * block_q + 2 * block_kv) * d * e + 2 * block_q * block_kv * e \
        + 2 * 2 * block_q * 4


@dataclasses.dataclass(frozen=True)
class BwdTraits:
    """The sm90 backward's kernel traits: run_mha_bwd_dispatch's template arguments (kBlockM,
    kBlockN, Stages_dO, SdP_swapAB, dKV_swapAB, dQ_swapAB, NumMmaWarpGroups, AtomLayoutMSdP,
    AtomLayoutNdKV, AtomLayoutMdQ, V_in_regs), hopper/flash_bwd_launch_template.h lines 311-390
    (Arch >= 90, no softcap; commit 0251105a, as flash3_spec's)."""
    block_q: int
    block_kv: int
    stages_do: int
    sdp_swap_ab: bool       # S and dP computed transposed (K Q^T, V dO^T): M runs over the keys
    dkv_swap_ab: bool       # dV, dK computed transposed (dO^T P, Q^T dS): M runs over the head dim
    dq_swap_ab: bool        # dQ computed transposed (K^T dS^T): M runs over the head dim
    warpgroups: int         # NumMmaWarpGroups
    atom_m_sdp: int         # AtomLayoutMSdP: warpgroups along the query rows of S and dP
    atom_n_dkv: int         # AtomLayoutNdKV: warpgroups along the keys of dV and dK
    atom_m_dq: int          # AtomLayoutMdQ: warpgroups along the query rows of dQ
    v_in_regs: bool         # Mma_dP_is_RS: dP's A operand (V) from registers

    @property
    def mma_dkv_is_rs(self) -> bool:
        """P and dS feed the dV and dK GEMMs from registers (mainloop_bwd_sm90_tma_gmma_ws.hpp line 75)."""
        return (self.atom_m_sdp == 1 and self.atom_n_dkv == self.warpgroups and self.sdp_swap_ab
                and not self.dkv_swap_ab)

    @property
    def mma_dq_is_rs(self) -> bool:
        """dS feeds the dQ GEMM from registers (line 76)."""
        return (self.atom_m_sdp == self.warpgroups and self.atom_m_dq == self.warpgroups and not self.sdp_swap_ab
                and not self.dq_swap_ab)


# (largest head dim, causal or None for both) -> traits; the first row that covers a head dim applies
FA3_BWD_TRAITS = (
    (64, None, BwdTraits(128, 128, 2, True, False, False, 2, 1, 2, 2, False)),     # line 320
    (96, None, BwdTraits(64, 128, 2, True, False, False, 2, 1, 2, 1, True)),       # line 337
    (128, True, BwdTraits(64, 128, 2, True, False, False, 2, 1, 2, 1, False)),     # line 351
    (128, False, BwdTraits(80, 128, 2, True, False, True, 2, 1, 2, 1, False)),     # line 353
    (192, None, BwdTraits(64, 96, 1, False, True, False, 3, 1, 1, 1, False)),      # line 367
    (256, None, BwdTraits(64, 80, 1, False, True, True, 2, 1, 1, 1, False)),       # line 380
)


def fa3_bwd_traits(head_dim: int, causal: bool) -> BwdTraits:
    """The sm90 backward kernel's traits for a head dim (FA3 rounds it up to 64, 96, 128, 192, 256)."""
    for max_d, mask, traits in FA3_BWD_TRAITS:
        if head_dim <= max_d and mask in (None, causal):
            return traits
    raise HbmsimError(f"flash3: head_dim = {head_dim}: the sm90 backward goes up to 256")


def wgmma_operand_bytes(m: float, n: float, k: float, atoms_n: int, a_from_smem: bool, itemsize: int) -> float:
    """Shared-memory bytes one tiled wgmma GEMM (an m x n output, k deep) reads, its warpgroups
    `atoms_n` along n (the rest along m). Each warpgroup issues wgmma.m64nNk16 over its part: an
    instruction reads its B slice (N x 16) from shared memory, and its A slice (64 x 16) too unless
    A sits in registers (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate":
    wgmma's B operand is always a shared-memory descriptor, A a descriptor or registers). So B is
    read once per 64 rows of m (m / 64 times), and A once per warpgroup column (atoms_n times).
    FlashAttention's own config search counts them so (flash_attn/cute/sm90_config_search.py,
    `_mma_traffic`, commit fb5c4fa8)."""
    return itemsize * ((atoms_n * m * k if a_from_smem else 0) + m * n * k / 64)


def bwd_gemm_operand_bytes(t: BwdTraits, rows: float, cols: int, d: int, tiles: int, itemsize: int) -> tuple:
    """(S and dP, dV and dK, dQ): the shared-memory operand bytes of one backward step's five GEMMs
    over `tiles` query tiles of `rows` rows in all against `cols` keys, by the kernel's tiled MMAs
    (mainloop_bwd_sm90_tma_gmma_ws.hpp lines 82-134: TileShapeAtom*, AtomLayout*). Computed per query
    tile (rows / tiles) and taken `tiles` times."""
    w, r = t.warpgroups, rows / tiles

    def gemm(m, n, k, atoms_n, a_from_smem):
        return tiles * wgmma_operand_bytes(m, n, k, atoms_n, a_from_smem, itemsize)

    # S = Q K^T and dP = dO V^T (rows x cols, d deep), or transposed (cols x rows): A is Q / dO, or K / V
    sdp = (r, cols, d, w // t.atom_m_sdp) if not t.sdp_swap_ab else (cols, r, d, t.atom_m_sdp)
    s_dp = gemm(*sdp, True) + gemm(*sdp, not t.v_in_regs)
    # dV = P^T dO and dK = dS^T Q (cols x d, rows deep), or transposed (d x cols): A is P^T / dS^T, or dO^T / Q^T
    dkv = (cols, d, r, w // t.atom_n_dkv) if not t.dkv_swap_ab else (d, cols, r, t.atom_n_dkv)
    dv_dk = 2 * gemm(*dkv, not t.mma_dkv_is_rs)
    # dQ = dS K (rows x d, cols deep), or transposed (d x rows): A is dS, or K^T
    dq = (r, d, cols, w // t.atom_m_dq) if not t.dq_swap_ab else (d, r, cols, t.atom_m_dq)
    return s_dp, dv_dk, gemm(*dq, not t.mma_dq_is_rs)


def flash3_training(wl: Workload, block_q: int, block_kv: int, data: AttentionData | None, bwd_blocks: tuple,
                    stages: int, intra_wg_overlap: bool, pingpong: bool, stages_do: int, warpgroups: int,
                    tiles_per_step: tuple = (1, 1), registers_per_thread: int = 0, pv_is_rs: bool = True,
                    instructions_per_score: float = 0.0, lpt: bool = False, tile_rows: int = 0,
                    whole_tiles: bool = True, sdp_passes: int = 1) -> Program:
    """flash3's forward, then its backward with bwd_blocks (block_q, block_kv), `lpt`: both in FA3's
    causal tile order; `instructions_per_score` and `sdp_passes` as flash3_backward's; `tile_rows` as
    flash3_forward's; `whole_tiles`: the forward's whole_kv and the backward's whole_tiles."""
    fwd = flash3_forward(wl, block_q, block_kv, data, stages, intra_wg_overlap, pingpong, False, tiles_per_step[0],
                         registers_per_thread, pv_is_rs, lpt, tile_rows, whole_tiles)
    bwd, grads = flash3_backward(wl, fwd, *bwd_blocks, data, stages_do, warpgroups, tiles_per_step[1],
                                 instructions_per_score, lpt, whole_tiles, sdp_passes)
    return Program("flash3_training", list(fwd.launches) + bwd, inputs=fwd.inputs, outputs={**fwd.outputs, **grads})


def flash3_backward(wl: Workload, fwd: Program, block_q: int, block_kv: int, data: AttentionData | None,
                    stages_do: int = 2, warpgroups: int = 2, q_step: int = 1,
                    instructions_per_score: float = 0.0, lpt: bool = False, whole_tiles: bool = True,
                    sdp_passes: int = 1) -> tuple:
    """The backward's launches after `fwd` and its gradients {dQ, dK, dV}. `whole_tiles`: every step
    computes whole block_q x block_kv tiles, a last block's rows and keys past the sequence too
    (zero-filled by TMA; FA3's wgmma and softmax have no bound on them); false: the real ones. `lpt`: the main kernel's
    blocks in FA3's causal order (flash3.lpt_bwd_tile), not the grid's. `instructions_per_score`
    (a kernel whose count Nsight measured: flash3_spec.CUDNN_BWD_INSTRUCTIONS_PER_SCORE; 0: FA3's
    counted operations): the main kernel's warp instructions a score, all issued in the step's
    softmax phase, the warpgroups being off the tensor pipe there (the PdS barrier), at the warp
    schedulers' rate (Launch.vector_work "instructions": the vector count is instructions x 32
    lanes, as PyTorch's counted kernels'). `sdp_passes`: how many times a step computes S = Q K^T and
    dP = dO V^T (1: FA3's; 2: a kernel that recomputes them, as Nsight's tensor-op count says cuDNN's
    head-dim-256 backward does: flash3_spec.CUDNN_BWD_SDP_PASSES)."""
    fa2, grads = flash2_backward(wl, fwd, block_q, block_kv, data, warps=8, q_step=q_step, batch_first=False)
    pre, fa2_main, convert, *sums = fa2
    dO, D, dQacc = pre.allocs
    dK, dV = fa2_main.allocs
    inputs = {t.name: t for t in fwd.inputs}
    Q, K, V = inputs["Q"], inputs["K"], inputs["V"]
    LSE = fwd.outputs["lse"]
    g_count, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    tr, tc = math.ceil(nq / block_q), math.ceil(nk / block_kv)
    scale, e = wl.softmax_scale, wl.itemsize
    numeric = data is not None
    traits = fa3_bwd_traits(d, wl.causal)       # the kernel's GEMM layouts (its tiles may be overridden)
    # 16-bit tiles a step stores to shared memory for the GEMMs after it: dS (the dQ GEMM's operand),
    # and P where the dV GEMM does not take it from registers
    stored_tiles = 1 if traits.mma_dkv_is_rs else 2
    dq_staged = d < 256          # dQacc_use_TMA: dQ's fp32 tile goes through shared memory to the TMA reduce-add

    @functools.cache
    def step_works(n: int, nc: int, tiles: int) -> tuple:
        """One warpgroup's share of a step's five compute calls, in FA3's bwd_step order, for a step of
        n query rows (`tiles` tiles) against nc keys: the same for every step of that shape, so made once."""
        sdp_bytes, dkv_bytes, dq_bytes = bwd_gemm_operand_bytes(traits, n, nc, d, tiles, e)
        # P's vector work: the recomputation's (bwd_vector_flops less dS's), or for a measured kernel all
        # of its instructions a score, 32 lanes each, issued here
        ds_ops = 0 if instructions_per_score else bwd_ds_flops(n, nc)
        p_ops = round(32 * instructions_per_score * n * nc) if instructions_per_score else \
            bwd_vector_flops(wl, n, nc) - ds_ops
        return (
            # S = Q K^T and dP = dO V^T (4 n nc d FLOPs, sdp_passes times), their operands read from
            # shared memory by each wgmma (bwd_gemm_operand_bytes)
            dict(matmul_flops=sdp_passes * 4 * n * nc * d // warpgroups,
                 sram_bytes=round(sdp_passes * sdp_bytes / warpgroups)),
            # P = exp2(S scale - lse) (its share of the rows): P's vector work and every exp
            dict(vector_flops=p_ops // warpgroups, exp_ops=n * nc // warpgroups),
            # dS = P o (dP - D) on the FP32 lanes after the exps, then the stored tiles (e bytes a score
            # each) through shared memory's 128 B/clk, before the next GEMM is issued
            dict(vector_flops=ds_ops // warpgroups, sram_bytes=stored_tiles * n * nc * e // warpgroups),
            # dV += P^T dO (2 n nc d FLOPs), issued before the barrier, its operand reads (P from
            # registers or the stored tile, dO) half the dV and dK GEMMs'
            dict(matmul_flops=2 * n * nc * d // warpgroups, sram_bytes=round(dkv_bytes / 2 / warpgroups)),
            # dK += dS^T Q, dQ = dS K (4 n nc d FLOPs): their operand reads (dS from registers or the
            # stored tile, Q, K again); dQ's fp32 tile (4 n d bytes) staged while dK's GEMM runs, and
            # read back by the TMA reduce-add
            dict(matmul_flops=4 * n * nc * d // warpgroups,
                 sram_bytes=round((dkv_bytes / 2 + dq_bytes + (2 * 4 * n * d if dq_staged else 0)) / warpgroups)))
    all_cols, one = slice(0, d), slice(0, 1)

    order, swizzle = lpt_bwd_tile(wl, tc, e) if lpt else (None, 1)

    def main(ctx, index):
        g, cols, nc, i_first = kv_block(wl, order(index) if lpt else index, tc, block_kv, block_q)
        c0, c1 = cols.start, cols.stop
        if i_first >= tr:        # no query sees this block: its gradients are zero
            yield from unseen_kv_block(ctx, dK, dV, g, cols, d, numeric)
            return
        kg = wl.kv_group(g)
        kv_load = ctx.prefetch((K[kg], cols, all_cols), (V[kg], cols, all_cols))
        starts = [i_first, *range((i_first // q_step + 1) * q_step, tr, q_step)]
        steps = []
        for i in starts:
            tiles = min(tr, (i // q_step + 1) * q_step) - i
            steps.append((block_rows(i, block_q, nq).start, block_rows(i + tiles - 1, block_q, nq).stop, tiles))
        loads: list = [None] * len(steps)
        ready = [ctx.event() for _ in steps]
        released = [ctx.event() for _ in steps]
        finished = [0] * len(steps)
        acc = {"dk": np.zeros((nc, d)) if numeric else None, "dv": np.zeros((nc, d)) if numeric else None}
        pds = ctx.barrier(warpgroups)          # the PdS named barrier of every MMA thread (bwd_step)

        def producer():
            for s_i, (r0, r1, _tiles) in enumerate(steps):
                if s_i >= stages_do:
                    yield released[s_i - stages_do]
                rows = slice(r0, r1)
                loads[s_i] = ctx.prefetch((Q[g], rows, all_cols), (dO[g], rows, all_cols), (LSE[g], rows, one),
                                          (D[g], rows, one))
                ready[s_i].succeed()

        def consumer(w):
            k, v = yield from ctx.wait(kv_load)
            for s_i, (r0, r1, tiles) in enumerate(steps):
                yield ready[s_i]
                q, d_o, lse, big_d = yield from ctx.wait(loads[s_i])
                # whole_tiles: the tiles' whole rows and columns, a last block's past the sequence too
                sdp, p_exps, ds_stores, dv, dk_dq = (step_works(tiles * block_q, block_kv, tiles) if whole_tiles
                                                     else step_works(r1 - r0, nc, tiles))
                yield from ctx.compute(**sdp)
                yield from ctx.compute(**p_exps)
                yield from ctx.compute(**ds_stores)
                yield from ctx.compute(**dv)
                # NamedBarrier::sync(NumMmaThreads, PdS): every consumer warpgroup has stored its part of
                # dS before any issues the dQ GEMM that reads all of it, so the warpgroups meet once a
                # step and their softmax phases run together, not under each other's GEMMs
                yield from pds.sync()
                yield from ctx.compute(**dk_dq)
                finished[s_i] += 1
                if finished[s_i] < warpgroups:
                    continue
                released[s_i].succeed()          # the slot's Q, dO, lse, D are no longer read
                dq_part = None
                if numeric:
                    p = recompute_p(wl, scale, q, k, allowed(wl, None, r0, r1, c0, c1), lse[:, 0])
                    dq_part, dk_part, dv_part = tile_grads(wl, scale, q, k, v, d_o, p, big_d[:, 0], None)
                    acc["dk"] += dk_part
                    acc["dv"] += dv_part
                yield from ctx.atomic_add(dQacc[g], slice(r0, r1), all_cols, dq_part)

        roles = [ctx.fork(producer())] + [ctx.fork(consumer(w)) for w in range(warpgroups)]
        for role in roles:
            yield role
        yield from ctx.store_tiles((dK[g], cols, all_cols, acc["dk"]), (dV[g], cols, all_cols, acc["dv"]))

    period = lpt_period(g_count, tc, swizzle) if lpt else row_blocks_period(wl, block_kv, nk)
    main_launch = Launch("flash3_bwd", g_count * tc, flash3_bwd_sram_bytes(wl, block_q, block_kv, stages_do), main,
                         allocs=(dK, dV), pass_name="backward", tensor_op=WGMMA, period=period,
                         threads_per_block=128 * (warpgroups + 1),
                         host_ops=0, vector_work=INSTRUCTIONS if instructions_per_score else FP32)
    renamed = [dataclasses.replace(pre, name="flash3_bwd_preprocess"), main_launch,
               dataclasses.replace(convert, name="flash3_bwd_convert_dq")]
    return renamed + sums, grads

