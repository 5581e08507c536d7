"""Row softmax on its own, as simulated programs whose passes over global memory are counted: why
fusing softmax into attention matters.

- safe softmax, three passes over each row: (1) read it for the row max m, (2) read it again for
  l = sum exp(x - m), (3) read it a third time to write exp(x - m) / l;
- online softmax, two passes: (1) read the row once, keeping a running max m and a running sum l
  that is rescaled by exp(m_old - m_new) whenever the max grows (the update FlashAttention uses
  per K/V tile), (2) read it again to write exp(x - m) / l;
- fused (flash attention): the scores never reach global memory, so softmax costs no pass at all.

X and Y are (G, R, C); each thread block owns one row and streams it in chunks of `chunk` columns
(so a row of any length fits SRAM). Numerics in float64; the storage dtype sets the bytes.
"""
from __future__ import annotations

import math

import numpy as np

from hbmsim.simulator import Launch, Program, Tensor

CHUNK = 1024           # columns per load: 4 KiB of fp32 per block in SRAM

# What the online softmax's annotations (ctx.note) mean, for whoever listens (`hbmsim explain`
# prints them from this table): per note, a heading ({row}, {cols}: the row and the columns of the
# chunk) and its values, one dict a printed line, each value with the formula that made it.
NOTES = {
    "online softmax chunk": {"heading": "row {row}, columns {cols}", "values": (
        {"m_old": "m_old", "m_new": "m_new = max(m_old, chunk max)", "c": "c = exp(m_old - m_new)",
         "l": "l = c l + sum exp(x - m_new)"},)},
}


def softmax_program(kind: str, x: Tensor, chunk: int = CHUNK) -> Program:
    """Y = softmax(X) over the last axis with `kind` "safe" (3 passes) or "online" (2 passes)."""
    if kind not in ("safe", "online"):
        raise ValueError(f"softmax kind {kind!r}: safe or online")
    g_count, r, c = x.shape
    y = Tensor("Y", x.shape, x.dtype, count_only=x.data is None)
    numeric = x.data is not None
    chunks = [slice(c0, min(c, c0 + chunk)) for c0 in range(0, c, chunk)]

    def block(ctx, index):
        g, row = divmod(index, r)
        row_s = slice(row, row + 1)
        m, l = -np.inf, 0.0
        if kind == "safe":
            # pass 1: m = max_j x_j (one compare per element)
            for cols in chunks:
                (t,) = yield from ctx.load_tiles((x[g], row_s, cols))
                yield from ctx.compute(vector_flops=cols.stop - cols.start)
                if numeric:
                    m = max(m, float(t.max()))
            # pass 2: l = sum_j exp(x_j - m) (subtract, exp, add: 3 per element, one of them an exp)
            for cols in chunks:
                (t,) = yield from ctx.load_tiles((x[g], row_s, cols))
                n = cols.stop - cols.start
                yield from ctx.compute(vector_flops=3 * n, exp_ops=n)
                if numeric and np.isfinite(m):
                    l += float(np.exp(t - m).sum())
        else:
            # one pass: per chunk m_new = max(m, chunk max), l = l exp(m - m_new) + sum exp(x - m_new):
            # compare, subtract, exp, add per element, plus the rescale (an exp and a multiply)
            for cols in chunks:
                (t,) = yield from ctx.load_tiles((x[g], row_s, cols))
                n = cols.stop - cols.start
                yield from ctx.compute(vector_flops=4 * n + 2, exp_ops=n + 1)
                if numeric:
                    m_new = max(m, float(t.max()))
                    if np.isfinite(m_new):
                        c_old = math.exp(m - m_new) if np.isfinite(m) else 0.0
                        l = l * c_old + float(np.exp(t - m_new).sum())
                        ctx.note("online softmax chunk", g=g, row=row, cols=(cols.start, cols.stop), m_old=m,
                                 m_new=m_new, c=c_old, l=l)
                    m = m_new
        # last pass: y_j = exp(x_j - m) / l (subtract, exp, divide: 3 per element)
        for cols in chunks:
            (t,) = yield from ctx.load_tiles((x[g], row_s, cols))
            n = cols.stop - cols.start
            yield from ctx.compute(vector_flops=3 * n, exp_ops=n)
            out = None
            if numeric:
                out = np.zeros_like(t) if l == 0 else np.exp(t - m) / l      # a row of -inf gives zeros
            yield from ctx.store(y[g], row_s, cols, out)

    launch = Launch(f"{kind}_softmax", g_count * r, min(chunk, c) * x.itemsize, block, allocs=(y,))
    return Program(f"{kind}_softmax", [launch], inputs=(x,), outputs={"Y": y})


def softmax_io(kind: str, shape: tuple, itemsize: int) -> dict:
    """Closed form of the global-memory bytes: every element read once per pass (3 safe, 2 online)
    and written once."""
    g_count, r, c = shape
    passes = 3 if kind == "safe" else 2
    return {"X": (passes * g_count * r * c * itemsize, 0), "Y": (0, g_count * r * c * itemsize)}
