"""The CPU emulation of the tensor-core kernel (kernels/flash_attention_tc.cu): a numpy model of
its tile schedule, its precision steps and every global access it issues, counted in 32-byte
sectors per warp-level instruction. Emulated, not measured on a GPU.

Per thread block (one per (batch-head, query block), grid order as the source's):
1. cp.async, 16 bytes a thread: Q_i, K_0 and V_0 (stage 0), then before each tile j the K_{j+1},
   V_{j+1} of the next stage; chunk c of a tile goes to thread c % threads in pass c / threads,
   rows past the sequence are zero-filled in shared memory and touch no global memory;
2. numerics, in the kernel's precisions: S = Q K^T in fp32 from fp16/bf16 inputs (mma.sync with
   fp32 accumulation); the masks; the online softmax in fp32 with exp2 (p = exp2(S log2(e) scale
   - m log2(e) scale), as FA2's softmax.h); P rounded to the input dtype (round to nearest even,
   cvt.rn); O += P V in fp32; O = O / l rounded to the input dtype; lse = m scale + log(l);
3. O_i staged in shared memory and stored 16 bytes a thread (valid rows only); lse stored by
   lanes 0, 4, .., 28 of each warp, 8 rows (32 bytes) an instruction, into an fp32 tensor of
   Nq8 = ceil(Nq / 8) * 8 rows per batch-head (rows Nq.. get -inf).
A warp instruction's sectors are the distinct 32-byte sectors its active lanes touch; a tensor's
emulated bytes are its sectors x 32. The accumulation order inside an mma (and of the row sums)
is the hardware's and is not modelled: outputs agree with the GPU's to fp32 rounding, not bit
for bit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hbmsim.simulator import HbmsimError

from .emulation_tc_config import CHUNK_BYTES, MMA_M, SECTOR_BYTES, TcConfig, lse_rows_padded

TENSORS = ("Q", "K", "V", "O", "lse")
LOG2E = math.log2(math.e)


def round_to_dtype(x, dtype: str) -> np.ndarray:
    """float32 values rounded to fp16 or bf16 (round to nearest even), returned as float32."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "fp16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        u = np.ascontiguousarray(x).view(np.uint32).astype(np.uint64)
        rounded = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000          # RNE on the low 16 bits
        out = rounded.astype(np.uint32).view(np.float32)
        return np.where(np.isnan(x), x, out)
    raise HbmsimError(f"tensor-core kernel: field 'dtype' = {dtype!r} must be one of fp16, bf16")


def warp_sectors(addresses: np.ndarray, nbytes: int, instruction: np.ndarray) -> int:
    """Distinct (instruction, sector) pairs of accesses of `nbytes` at byte `addresses`, the
    accesses listed in issue order with their warp instruction's id (ids non-decreasing)."""
    if addresses.size == 0:
        return 0
    first, last = addresses // SECTOR_BYTES, (addresses + nbytes - 1) // SECTOR_BYTES
    key = instruction.astype(np.int64) << 40                 # sectors below 2^40: 32 TiB of memory
    return int(np.unique(np.concatenate([key + first, key + last])).size)


def tile_copy_sectors(row_start: int, rows: int, row_bytes: int, threads: int) -> int:
    """Sectors of a block-wide copy of `rows` rows of `row_bytes` bytes (row r at byte row_start +
    r * row_bytes), 16 bytes a thread: chunk c by thread c % threads, in pass c // threads; warp
    instruction (pass, warp) = c // 32 (threads is a multiple of 32)."""
    per_row = row_bytes // CHUNK_BYTES
    c = np.arange(rows * per_row, dtype=np.int64)
    addr = row_start + (c // per_row) * row_bytes + (c % per_row) * CHUNK_BYTES
    return warp_sectors(addr, CHUNK_BYTES, c // 32)


def lse_store_sectors(row_start: int, rows: int, warps: int, rows_per_warp: int) -> int:
    """Sectors of the lse stores: warp w, m-tile t, half h writes rows w*rpw + 16t + 8h + lane/4
    for lanes 0, 4, .., 28 (4 bytes each) that fall in the block's `rows`."""
    total = 0
    for w in range(warps):
        for t in range(rows_per_warp // MMA_M):
            for h in range(2):
                r = w * rows_per_warp + MMA_M * t + 8 * h + np.arange(8)
                r = r[r < rows]
                total += warp_sectors(row_start + 4 * r, 4, np.zeros(r.size, dtype=np.int64))
    return total


@dataclass
class TcEmulatedRun:
    o: np.ndarray              # (batch, heads, Nq, d) float32, values of the storage dtype
    lse: np.ndarray            # (batch, heads, Nq) float32
    lse_padded: np.ndarray     # (batch, heads, Nq8) float32, as the kernel writes it
    traffic: dict              # tensor -> (read_bytes, write_bytes) = sectors x 32, emulated
    sectors: dict              # tensor -> (read sectors, write sectors)
    smem_bytes: int            # dynamic shared memory per block (TcConfig.smem_bytes)
    config: TcConfig


def _check_inputs(q, k, v, dtype: str):
    arrays = [np.asarray(x, dtype=np.float32) for x in (q, k, v)]
    for name, a in zip("qkv", arrays):
        if a.ndim != 4:
            raise HbmsimError(f"input {name}: shape {a.shape} must be (batch, heads, seq, head_dim)")
        if not np.array_equal(round_to_dtype(a, dtype), a, equal_nan=True):
            raise HbmsimError(f"input {name}: values are not all {dtype} numbers (round them with round_to_dtype)")
    q, k, v = arrays
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise HbmsimError(f"inputs: q {q.shape}, k {k.shape}, v {v.shape} must share batch, heads and head_dim "
                          "(k and v the same shape)")
    return q, k, v


def emulate_flash_attention_tc(q, k, v, *, dtype: str = "fp16", block_q: int | None = None,
                               block_kv: int | None = None, warps: int | None = None, causal: bool = False,
                               scale: float | None = None) -> TcEmulatedRun:
    """Run the kernel's model on (batch, heads, seq, head_dim) arrays whose values are `dtype`
    numbers (fp16 or bf16). Blocks and warps default to the launch rule (TC_TRAITS)."""
    q, k, v = _check_inputs(q, k, v, dtype)
    b, h, nq, d = q.shape
    nk = k.shape[2]
    cfg = TcConfig.default(dtype, d, block_q, block_kv, warps)
    if nq < 1 or nk < 1:
        raise HbmsimError(f"inputs: seq_len_q = {nq} and seq_len_kv = {nk} must be >= 1")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    scale_log2 = np.float32(scale * LOG2E)
    e, bq, bkv, threads = cfg.itemsize, cfg.block_q, cfg.block_kv, cfg.threads
    row_bytes, nq8, rpw = d * e, lse_rows_padded(nq), bq // cfg.warps
    o = np.zeros((b, h, nq, d), np.float32)
    lse_pad = np.full((b, h, nq8), -np.inf, np.float32)
    sec = {name: [0, 0] for name in TENSORS}
    qv, kvv, vv = (x.reshape(b * h, -1, d) for x in (q, k, v))
    for g in range(b * h):                      # grid: (query block, batch-head), x fastest
        for r0 in range(0, nq, bq):
            r1 = min(nq, r0 + bq)
            n = r1 - r0
            kv_end = max(0, min(nk, r1 + nk - nq)) if causal else nk
            sec["Q"][0] += tile_copy_sectors((g * nq + r0) * row_bytes, n, row_bytes, threads)
            qf = qv[g, r0:r1]
            m = np.full(n, -np.inf, np.float32)
            l = np.zeros(n, np.float32)
            acc = np.zeros((n, d), np.float32)
            rows = np.arange(r0, r1)[:, None]
            for c0 in range(0, kv_end, bkv):
                c1 = min(nk, c0 + bkv)
                for name in ("K", "V"):
                    sec[name][0] += tile_copy_sectors((g * nk + c0) * row_bytes, c1 - c0, row_bytes, threads)
                s = qf @ kvv[g, c0:c1].T                       # fp32 mma accumulate
                if causal:
                    s = np.where(np.arange(c0, c1)[None, :] <= rows + (nk - nq), s, np.float32(-np.inf))
                m_prev = m
                m = np.maximum(m, s.max(axis=1))
                m_safe = np.where(m == -np.inf, np.float32(0), m)
                alpha = np.exp2((m_prev - m_safe) * scale_log2)
                # the kernel's fma(s, scale_log2, -m_safe * scale_log2): one rounding, then exp2f
                p = np.exp2((s.astype(np.float64) * scale_log2 - (m_safe * scale_log2)[:, None].astype(np.float64))
                            .astype(np.float32))
                l = alpha * l + p.sum(axis=1, dtype=np.float32)
                acc = alpha[:, None] * acc + round_to_dtype(p, dtype) @ vv[g, c0:c1]    # P in the input dtype
            ok = l > 0
            inv = np.where(ok, np.float32(1) / np.where(ok, l, np.float32(1)), np.float32(1))
            o.reshape(b * h, nq, d)[g, r0:r1] = round_to_dtype(acc * inv[:, None], dtype)
            with np.errstate(divide="ignore"):
                lse_rows = np.where(ok, m * np.float32(scale) + np.log(np.where(ok, l, 1)), -np.inf)
            lse_pad.reshape(b * h, nq8)[g, r0:r1] = lse_rows.astype(np.float32)
            sec["O"][1] += tile_copy_sectors((g * nq + r0) * row_bytes, n, row_bytes, threads)
            sec["lse"][1] += lse_store_sectors((g * nq8 + r0) * 4, min(nq8, r0 + bq) - r0, cfg.warps, rpw)
    traffic = {name: (r * SECTOR_BYTES, w * SECTOR_BYTES) for name, (r, w) in sec.items()}
    return TcEmulatedRun(o, lse_pad[..., :nq].copy(), lse_pad, traffic, {n: tuple(v) for n, v in sec.items()},
                         cfg.smem_bytes, cfg)
