"""Pieces every attention program shares: its input tensors and its flop accounting.

Vector flops are counted per element as the kernels do the work: scale 1, mask 1, running max 1,
subtract + exp 2, sum 1 (softmax: also the divide, 1), dropout 2 (compare + multiply). They only
set compute time; traffic never depends on them.
"""
from __future__ import annotations

import math

import numpy as np

from hbmsim.simulator import HbmsimError, Tensor

from .workload import AttentionData, Workload, allowed

STATS_DTYPE = "fp32"       # m, l and log-sum-exp are kept in fp32, as FlashAttention does
MASK_DTYPE = "bool"        # standard attention's masks and dropout mask: 1 byte per element
INDEX_DTYPE = "int32"      # kv_lens


def online_softmax_vector_flops(wl: Workload, rows: int, cols: int) -> int:
    """One score tile of an online softmax: per score scale, max, sub+exp, sum (+mask, +dropout);
    per row the m/l updates; the accumulator rescale."""
    per_score = 5 + (1 if wl.masked else 0) + (2 if wl.dropout > 0 else 0)
    return rows * cols * per_score + 6 * rows + rows * wl.head_dim


def refuse_paged(wl: Workload, program: str) -> None:
    """A program that reads K/V contiguously refuses a paged KV cache, in one line (flash2 and
    flash3 model FA2's block table and FA3's page_table: algorithms/paged.py)."""
    if wl.kv_page_size is not None:
        raise HbmsimError(f"{program}: field 'kv_page_size' = {wl.kv_page_size}: only flash2 and flash3 model a "
                          "paged KV cache (FA2's block_table, FA3's page_table); leave it out (contiguous K/V)")


def input_tensors(wl: Workload, data: AttentionData | None, paged: bool = False) -> dict:
    """Q as (batch*heads, seq, head_dim), K and V as (batch*kv_heads, seq, head_dim), in the storage
    dtype (query batch-head g reads K/V batch-head wl.kv_group(g)); kv_lens when padding is on.
    `paged`: the caller lays K/V out as pages itself (paged.KVLayout); else a paged workload is
    refused."""
    g, nq, nk, d = wl.groups, wl.seq_len_q, wl.seq_len_kv, wl.head_dim
    gk = wl.kv_groups
    count_only = data is None
    if not paged:
        refuse_paged(wl, "workload")
    if data is not None:
        data.check(wl)
    tensors = {
        "Q": Tensor("Q", (g, nq, d), wl.dtype, None if count_only else data.q.reshape(g, nq, d), count_only),
        "K": Tensor("K", (gk, nk, d), wl.dtype, None if count_only else data.k.reshape(gk, nk, d), count_only),
        "V": Tensor("V", (gk, nk, d), wl.dtype, None if count_only else data.v.reshape(gk, nk, d), count_only),
    }
    if wl.key_padding_mask:
        lens = None if count_only else data.kv_lens.reshape(wl.batch, 1, 1).astype(np.float64)
        tensors["kv_lens"] = Tensor("kv_lens", (wl.batch, 1, 1), INDEX_DTYPE, lens, count_only)
    return tensors


def scaled_keep_mask(wl: Workload, data: AttentionData | None) -> np.ndarray | None:
    """Dropout keep mask as (groups, Nq, Nkv), scaled by 1/(1-p); None without dropout or data."""
    if data is None or wl.dropout <= 0:
        return None
    return data.keep.reshape(wl.groups, wl.seq_len_q, wl.seq_len_kv) / (1.0 - wl.dropout)


def output(wl: Workload, name: str, rows: int, cols: int, dtype: str, data) -> Tensor:
    return Tensor(name, (wl.groups, rows, cols), dtype, count_only=data is None)


# ---- pieces the flash programs share ----------------------------------------------------------

def block_rows(i: int, block: int, n: int) -> slice:
    """Rows of block i when n rows are cut into blocks of `block` (the last one ragged)."""
    return slice(i * block, min(n, (i + 1) * block))


def load_kv_len(ctx, tensors: dict, wl: Workload, g: int):
    """Load batch-head g's number of valid keys (key padding): a 4-byte tile of kv_lens. Returns
    it, or None when key padding is off or the run is count-only. (`yield from` it.)"""
    if not wl.key_padding_mask:
        return None
    lens = yield from ctx.load(tensors["kv_lens"][g // wl.heads], slice(0, 1), slice(0, 1))
    return None if lens is None else int(lens[0, 0])


def finite_or_zero(m: np.ndarray) -> np.ndarray:
    """A running max with -inf (a row that has seen only masked keys) replaced by 0, so that
    exp(s - m) is 0 for masked scores, never NaN."""
    return np.where(np.isfinite(m), m, 0.0)


def masked_scores(wl: Workload, scale: float, q, k, kv_len, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
    """S = scale Q K^T for query rows r0:r1 and keys c0:c1, -inf where the masks forbid."""
    s = scale * (q @ k.T)
    ok = allowed(wl, kv_len, r0, r1, c0, c1)
    return s if ok is None else np.where(ok, s, -np.inf)


def unnormalised_softmax_step(s: np.ndarray, m: np.ndarray, l: np.ndarray) -> tuple:
    """One tile of FlashAttention-2's online softmax on an *unnormalised* output (scores s: n x nc):
    m_new = max(m, rowmax s); P = exp(s - m_new); alpha = exp(m - m_new), the rescale of what came
    before (acc = alpha acc + P V); l_new = alpha l + rowsum P. Returns (m_new, P, alpha, l_new);
    a row that has seen only masked keys keeps m = -inf and gets P = 0 (finite_or_zero)."""
    m_new = np.maximum(m, s.max(axis=1))
    m_safe = finite_or_zero(m_new)
    p = np.exp(s - m_safe[:, None])
    alpha = np.exp(m - m_safe)
    return m_new, p, alpha, alpha * l + p.sum(axis=1)


def normalised_rows(acc: np.ndarray, l: np.ndarray, m: np.ndarray) -> tuple:
    """The end of an unnormalised online softmax: O = acc / l and lse = m + log l (n x 1); rows
    that saw no key (l = 0) get O = 0 and lse = -inf."""
    pos = l > 0
    o = np.zeros(acc.shape)
    o[pos] = acc[pos] / l[pos, None]
    lse = np.full((acc.shape[0], 1), -np.inf)
    lse[pos, 0] = m[pos] + np.log(l[pos])
    return o, lse


def online_softmax_update(s, v, o, l, m, keep):
    """One step of online softmax on a *normalised* output (FlashAttention Algorithm 1, lines
    9-13): tile max and sum, m_new = max(m, m_tile), rescale old and new by exp(m - m_new),
    O = (l exp(m_old - m_new) O + exp(m_tile - m_new) P V) / l_new. Rows that have seen only
    masked keys stay O = 0, l = 0. Dropout (`keep`, scaled) applies to P only, not to l.
    Returns (o_new, l_new, m_new), l and m as columns."""
    m_tile = s.max(axis=1)
    p = np.exp(s - finite_or_zero(m_tile)[:, None])
    l_tile = p.sum(axis=1)
    m_new = np.maximum(m, m_tile)
    m_new_safe = finite_or_zero(m_new)
    a_old, a_tile = np.exp(m - m_new_safe), np.exp(m_tile - m_new_safe)
    l_new = a_old * l + a_tile * l_tile
    if keep is not None:
        p = p * keep
    num = (l * a_old)[:, None] * o + a_tile[:, None] * (p @ v)
    o_new = np.divide(num, l_new[:, None], out=np.zeros_like(num), where=l_new[:, None] > 0)
    return o_new, l_new[:, None], m_new[:, None]


# Fast mode (hbmsim run, count-only): a block whose inner loop has more than COARSE_ABOVE_TILES
# tiles is simulated in steps of several tiles, keeping STEPS_PER_BLOCK steps or more per block.
# Every count is still the sum of the tiles' own; the time differs from a step per tile only in
# how much of the first and last loads the block waits for (tests/test_fold.py measures it).
COARSE_ABOVE_TILES = 256
STEPS_PER_BLOCK = 128
# A launch whose blocks all run loops of the same length (no causal mask) keeps its schedule under
# coarser steps for loops of 33 to 1024 tiles: compared with the full simulation over the
# FlashAttention-2 paper's H100 grid (N = 2048-16384), steps of up to EVEN_MAX_TILES_PER_STEP tiles,
# 16 or more a block, moved pass times by 0.4% at most. Longer steps are not taken: at N = 65536,
# 64-tile steps moved the forward by 1.5% (the first step's loads wait unhidden). Under a causal mask
# (rows of every length, a schedule sensitive to each block's time) such steps moved the forward by up
# to 2.5%: those launches keep the steps above.
EVEN_COARSE_ABOVE_TILES = 32
EVEN_STEPS_PER_BLOCK = 16
EVEN_MAX_TILES_PER_STEP = 8
# Under a causal mask, for a caller that gives the grid's `blocks` (FA3's forward), in a grid of
# CAUSAL_MIN_BLOCKS blocks or more (about 8 waves of one block per SM on a 132-SM GPU): a loop of 64
# or more tiles takes tiles // CAUSAL_STEPS_PER_BLOCK a step, up to CAUSAL_MAX_TILES_PER_STEP, each
# block by its own loop, its tiles kept as the L2's lines of single tiles (tensor.L2Lines, so that
# every block asks the tile-granular L2 for the same lines). Against a step per tile, FA3's forward
# (H100, N = 16384/16896, head dims 64-256, fp16 and FP8) within 0.5%. flash2 gives no grid: its
# causal forwards moved by -2.1..+2.2% (docs/speed.md). In a grid of a wave or two the longest
# blocks end the kernel and coarser steps show (-1.9% with 264 blocks): those keep the rule above.
CAUSAL_MIN_BLOCKS = 1024
CAUSAL_STEPS_PER_BLOCK = 32
CAUSAL_MAX_TILES_PER_STEP = 4
# A key-parallel backward (bwd_tiles_per_step) takes the causal rule in a grid of
# CAUSAL_BWD_MIN_BLOCKS K/V blocks or more (about 16 waves of one block per SM): against a step per
# query tile, the backward passes of every causal training run of the shipped sets with such a grid
# moved by 0.07-0.26% (FA2: H100, H200, A100, head dims 64 and 128) and -0.01..-0.66% (FA3), at
# 10-50% less CPU time; FA3's head dim 256 (about 1,650 blocks of 64 x 80) moved by -0.6..-1.1%
# and keeps a step per tile (docs/speed.md).
CAUSAL_BWD_MIN_BLOCKS = 2048
# Long causal loops (fast mode; a million tokens): in a forward launch under a causal mask whose
# longest loop has more than LONG_CAUSAL_TILES tiles, in a grid of LONG_CAUSAL_MIN_BLOCKS blocks or
# more (31 waves of two blocks an SM on a 132-SM GPU: in 8 to 16 waves, where a causal launch's last
# and longest blocks land moved its time by up to 2-4% either way), every block takes
# tiles // LONG_CAUSAL_STEPS_PER_BLOCK a step, and every K/V load stays in the L2 as prefix lines
# (tensor.L2Lines with prefix: every block streams K and V from key 0, so a line is the prefix of
# its tiles read so far; l2.py sizes the lines by the cache), so that a step costs the L2 a line or
# two, not a line a tile. Measured against the full simulation: docs/speed.md, "Long causal
# contexts".
LONG_CAUSAL_TILES = 512
LONG_CAUSAL_STEPS_PER_BLOCK = 32
LONG_CAUSAL_MIN_BLOCKS = 8192


def tiles_per_step(tiles: int, even: bool = False, blocks: int = 0) -> int:
    """Tiles one simulated step covers in fast mode, for an inner loop of `tiles` tiles in a grid
    of `blocks`; `even`: every block of the launch runs a loop as long."""
    step = 1 if tiles <= COARSE_ABOVE_TILES else tiles // STEPS_PER_BLOCK
    if even and tiles > EVEN_COARSE_ABOVE_TILES:
        step = max(step, min(EVEN_MAX_TILES_PER_STEP, tiles // EVEN_STEPS_PER_BLOCK))
    if not even and blocks >= CAUSAL_MIN_BLOCKS:
        step = max(step, min(CAUSAL_MAX_TILES_PER_STEP, tiles // CAUSAL_STEPS_PER_BLOCK))
    return step


def long_causal(wl: Workload, block_q: int, block_kv: int) -> bool:
    """Whether a forward launch under a causal mask runs, in fast mode, its blocks in
    LONG_CAUSAL_STEPS_PER_BLOCK steps each and keeps its K/V loads as the L2's prefix lines: its
    longest loop has more than LONG_CAUSAL_TILES tiles, in a grid of LONG_CAUSAL_MIN_BLOCKS blocks
    or more."""
    return (wl.causal and math.ceil(wl.seq_len_kv / block_kv) > LONG_CAUSAL_TILES
            and wl.groups * math.ceil(wl.seq_len_q / block_q) >= LONG_CAUSAL_MIN_BLOCKS)


def fwd_tiles_per_step(wl: Workload, block_q: int, block_kv: int, blocks: int = 0) -> int:
    """K/V tiles a fast-mode forward step (FA2's, FA3's) covers at most: tiles_per_step over the
    longest loop (`blocks`: the grid's, for its causal rule), or 1 / LONG_CAUSAL_STEPS_PER_BLOCK
    of it in a long causal launch (long_causal)."""
    tiles = math.ceil(wl.seq_len_kv / block_kv)
    step = tiles_per_step(tiles, not wl.causal, blocks)
    if long_causal(wl, block_q, block_kv):
        step = max(step, tiles // LONG_CAUSAL_STEPS_PER_BLOCK)
    return step


def bwd_tiles_per_step(wl: Workload, block_q: int, block_kv: int) -> int:
    """Query tiles a fast-mode step of a key-parallel backward (FA2's, FA3's) covers at most:
    tiles_per_step over the longest loop (every query block), in the main kernel's grid of
    batch-heads x K/V blocks. Each block's steps end at multiples of it, so that every block asks
    the L2 for the same tiles."""
    blocks = wl.groups * math.ceil(wl.seq_len_kv / block_kv)
    return tiles_per_step(math.ceil(wl.seq_len_q / block_q), not wl.causal,
                          blocks if blocks >= CAUSAL_BWD_MIN_BLOCKS else 0)


def fa2_batch_head(wl: Workload, bh: int) -> int:
    """The batch-head g = b x heads + h at place `bh` of FA2's grids, which are (blocks, batch,
    heads) (flash_fwd_launch_template.h: dim3 grid(num_m_block, params.b, params.h); the backward's
    alike): blocks are handed out in the grid's order, so a block's batch turns before its head,
    bh = h x batch + b. Alike batch-heads run alike; where query heads share K and V (grouped-query
    attention, batch > 1), the heads of a group are `batch` x blocks apart, not side by side."""
    h, b = divmod(bh, wl.batch)
    return b * wl.heads + h


def row_blocks_period(wl: Workload, block: int, seq_len: int) -> int:
    """The `period` (program.Launch) of a launch with one block per (batch-head, block of
    `block` rows of a `seq_len`-long side): every block alike when no mask makes them differ
    and the last block is whole; else the blocks of one batch-head."""
    per_group = math.ceil(seq_len / block)
    return 1 if not wl.causal and seq_len % block == 0 else per_group
