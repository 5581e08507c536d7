"""`hbmsim explain`: why attention is memory-bound and how tiling plus online softmax fixes it,
worked through on a small example with numbers you can check by hand.

Everything printed comes from the instrumented programs themselves: their annotations
(`BlockContext.note`, which cost nothing when nobody listens), the simulator's trace of loads and
its per-tensor byte counters. Nothing here recomputes attention a second way, except the last line
of each part, which compares with the float64 reference.

Sections: standard attention kernel by kernel (S = QK^T, the row max, exponentials and sums, P,
O, and the bytes each kernel moves through global memory); flash attention (flash2) tile by tile
(the loads, S_ij, the tile max, m_old -> m_new, c = exp(m_old - m_new), the local exponentials,
l, the unnormalised O, the final division by l); flash2's backward pass (D = rowsum(dO o O),
and per tile P recomputed from the log-sum-exp, dV, dP, dS, dQ, dK); and softmax on its own
(algorithms/softmax.py): three passes over global memory (safe), two (online), none (fused).

The flash and softmax parts print the programs' annotations as the programs describe them (each
module's NOTES: a heading and, per value, the formula that made it); `render` knows no note by name.
The default example is the project's worked example (README, tests/conftest.py's `seed` fixture,
`hbmsim demo`'s first lines): its data is written here only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hbmsim.algorithms import registry
from hbmsim.algorithms.flash2 import NOTES as FLASH2_NOTES
from hbmsim.algorithms.flash2_backward import NOTES as FLASH2_BACKWARD_NOTES
from hbmsim.algorithms.flash2_backward import flash2_training
from hbmsim.algorithms.reference import attention_backward, attention_forward
from hbmsim.algorithms.softmax import NOTES as SOFTMAX_NOTES
from hbmsim.algorithms.softmax import softmax_program
from hbmsim.algorithms.standard import standard_forward
from hbmsim.algorithms.workload import AttentionData, Workload
from hbmsim.simulator import HbmsimError, Tensor, simulate

# The worked example (README, "What the demo shows"): 4 x 4, scale 1, blocks of 2; V = 1..16.
DEFAULT_Q = [[1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 0, 0], [0, 1, 0, 0]]
DEFAULT_K = [[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1]]
DEFAULT_V = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]]
DEFAULT_DO = [[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
MAX_ROWS, MAX_HEAD_DIM = 256, 256    # a walkthrough prints every score: bigger is for `hbmsim run`

@dataclass(frozen=True)
class Example:
    q: np.ndarray          # (Nq, d)
    k: np.ndarray          # (Nkv, d)
    v: np.ndarray          # (Nkv, d)
    d_o: np.ndarray        # (Nq, d): the output gradient the backward starts from
    scale: float = 1.0
    causal: bool = False
    block_q: int = 2
    block_kv: int = 2
    dtype: str = "fp32"
    source: str = "the default 4 x 4 example"

    def workload(self) -> Workload:
        nq, d = self.q.shape
        return Workload(1, 1, nq, self.k.shape[0], d, dtype=self.dtype, causal=self.causal, scale=self.scale)

    def data(self) -> AttentionData:
        return AttentionData(self.q[None, None], self.k[None, None], self.v[None, None], d_o=self.d_o[None, None])


def default_example(**options) -> Example:
    arrays = [np.array(a, dtype=float) for a in (DEFAULT_Q, DEFAULT_K, DEFAULT_V, DEFAULT_DO)]
    return Example(*arrays, **options)


def every_program(gpu) -> str:
    """`hbmsim demo`'s first lines: the default example through every registered program (every
    block and tile 2 wide), each program's O against the float64 reference."""
    ex = default_example()
    wl = ex.workload()
    data = lambda: AttentionData(ex.q[None, None].copy(), ex.k[None, None].copy(), ex.v[None, None].copy())
    o_ref, _ = attention_forward(wl, data())
    lines = ["Seed example (Q, K 4x4, V = 1..16, scale 1, blocks 2x2): O through the simulator",
             np.array2string(o_ref[0, 0], precision=2)]
    for spec in registry.algorithms():
        mapping, _ = spec.resolved(gpu, wl, spec.uniform(2), False)
        prog = spec.build(wl, mapping, data(), False)
        o = simulate(gpu, prog).outputs["O"][0]
        lines.append(f"  {prog.name:17s} max |O - reference| = {np.max(np.abs(o - o_ref[0, 0])):.1e}")
    return "\n".join(lines)


def random_example(nq: int, nkv: int, d: int, seed: int, **options) -> Example:
    rng = np.random.default_rng(seed)
    q, k, v, d_o = (np.round(rng.standard_normal(shape), 2) for shape in ((nq, d), (nkv, d), (nkv, d), (nq, d)))
    return Example(q, k, v, d_o, source=f"a random {nq} x {nkv} example, head dim {d}, seed {seed}", **options)


def load_example(path: str, **options) -> Example:
    """Q, K, V (and optionally dO, else ones) from a JSON file of nested lists or an .npz file;
    every problem is one line naming the file, the array and what is wrong."""
    p = Path(path)
    try:
        if p.suffix == ".npz":
            with np.load(p) as z:
                raw = {name: z[name] for name in z.files}
        else:
            raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise HbmsimError(f"inputs file '{path}' not found") from None
    except (OSError, ValueError, json.JSONDecodeError) as err:
        raise HbmsimError(f"{path}: cannot be read as JSON or .npz ({err})") from None
    if not isinstance(raw, dict):
        raise HbmsimError(f"{path}: must hold an object with arrays Q, K, V (and optionally dO)")
    arrays = {}
    for name in ("Q", "K", "V", "dO"):
        if name not in raw:
            if name == "dO":
                continue
            raise HbmsimError(f"{path}: missing array '{name}' (needs Q, K, V; dO is optional)")
        try:
            a = np.array(raw[name], dtype=float)
        except (TypeError, ValueError):
            raise HbmsimError(f"{path}: array '{name}' is not a matrix of numbers") from None
        if a.ndim != 2 or 0 in a.shape:
            raise HbmsimError(f"{path}: array '{name}' has shape {a.shape}, must be a non-empty matrix (rows x cols)")
        if not np.all(np.isfinite(a)):
            raise HbmsimError(f"{path}: array '{name}' contains NaN or inf")
        arrays[name] = a
    q, k, v = arrays["Q"], arrays["K"], arrays["V"]
    d_o = arrays.get("dO", np.ones_like(q))
    if k.shape[1] != q.shape[1]:
        raise HbmsimError(f"{path}: K has {k.shape[1]} columns but Q has {q.shape[1]}: they must agree")
    if v.shape != k.shape:
        raise HbmsimError(f"{path}: V has shape {v.shape} but K has {k.shape}: they must agree")
    if d_o.shape != q.shape:
        raise HbmsimError(f"{path}: dO has shape {d_o.shape} but Q has {q.shape}: they must agree")
    return Example(q, k, v, d_o, source=f"the inputs in {path}", **options)


class Notes:
    """The listener: every annotation and every load, in simulated-time order."""

    def __init__(self):
        self.notes: list = []
        self.loads: list = []

    def note(self, t, sm, kernel, block, what, values):
        self.notes.append((t, kernel, block, what, values))

    def trace(self, t, sm, kernel, block, what):
        if what.startswith("load"):
            self.loads.append((t, sm, kernel, block, what.split("load", 1)[1].strip()))

    def of(self, what: str) -> list:
        return [n for n in self.notes if n[3] == what]

    def described(self, table: dict, block: int | None = None) -> list:
        """The annotations `table` (a program's NOTES) describes, of thread block `block` or all."""
        return [n for n in self.notes if n[3] in table and (block is None or n[2] == block)]


def fmt(x, digits: int = 3) -> str:
    """A number or a vector with `digits` decimals (-inf as -inf)."""
    a = np.asarray(x, dtype=float)
    if a.ndim == 0:
        return "-inf" if a == -np.inf else f"{float(a):.{digits}f}"
    return "[" + ", ".join(fmt(v, digits) for v in a) + "]"


def _matrix(name: str, a, indent: str = "  ") -> str:
    """`name =` then the matrix, a row per line."""
    rows = np.atleast_2d(np.asarray(a, dtype=float))
    return f"{indent}{name} =\n" + "\n".join(f"{indent}    {fmt(r)}" for r in rows)


def _heading(template: str | None, values: dict) -> str:
    """A NOTES heading with {rows}, {cols} (spans, printed first..last) and {row} filled in."""
    if template is None:
        return ""
    spans = {k: f"{v[0]}..{v[1] - 1}" if isinstance(v, tuple) else v for k, v in values.items()
             if k in ("g", "row", "rows", "cols", "split")}
    return template.format(**spans)


def render(about: dict, values: dict, indent: str) -> list:
    """One annotation as its program describes it (`about`: an entry of the program's NOTES): the
    heading, then each line of values, `label = value`, per query row ("per_row") or once
    ("values", where a matrix takes a line per row)."""
    head = _heading(about["heading"], values)
    line = lambda labels, pick: ", ".join(f"{label} = {fmt(pick(values[key]))}" for key, label in labels.items())
    if "per_row" in about:
        out = [f"{indent}{head}:"] if head else []
        inner = indent + "  " if head else indent
        r0, r1 = values["rows"]
        for i in range(r1 - r0):
            lead = f"row {r0 + i}: "
            out += [inner + (lead if j == 0 else " " * len(lead)) + line(labels, lambda v: v[i])
                    for j, labels in enumerate(about["per_row"])]
        return out
    out = [f"{indent}{head}:"]
    for n, labels in enumerate(about["values"]):
        if any(np.ndim(values[key]) == 2 for key in labels):
            out += [_matrix(label, values[key], indent + "  ") for key, label in labels.items()]
        elif n == 0:                                     # the first line of values ends the heading's
            out[0] += " " + line(labels, lambda v: v)
        else:
            out.append(indent + "  " + line(labels, lambda v: v))
    return out


def _bytes_by_kernel(result) -> list:
    lines = []
    for k in result.kernels:
        parts = [f"{name} " + " + ".join(f"{n} B {how}" for n, how in ((t.read, "read"), (t.write, "written")) if n)
                 for name, t in sorted(k.tensors.items()) if t.read or t.write]
        lines.append(f"  {k.name:14s} {', '.join(parts) if parts else '(no global memory traffic)'}")
    return lines


def standard_part(ex: Example, gpu) -> tuple[list, np.ndarray, np.ndarray]:
    """(lines, O, the scores the softmax kernel read)."""
    wl, data = ex.workload(), ex.data()
    notes = Notes()
    result = simulate(gpu, standard_forward(wl, data), listener=notes.note)
    out = ["1. Standard attention: every N x N matrix goes through global memory", ""]
    s_parts = [v for *_, v in notes.of("gemm") if v["out"] == "S"]
    out.append("  S = Q K^T (kernel gemm_qk, written to global memory):")
    s = np.zeros((wl.seq_len_q, wl.seq_len_kv))
    for v in s_parts:
        s[slice(*v["rows"]), slice(*v["cols"])] = v["value"]
    out.append(_matrix("S", s))
    if ex.scale != 1.0:
        out.append(f"  (kernel scale multiplies S by {ex.scale:g}, reading and writing it again)")
    softmax_in = np.zeros((wl.seq_len_q, wl.seq_len_kv))
    for *_, v in notes.of("softmax"):
        r0, _ = v["rows"]
        softmax_in[slice(*v["rows"])] = v["S"]
        out.append(f"  softmax, rows {v['rows'][0]}..{v['rows'][1] - 1} (kernel softmax reads S, writes P):")
        for i in range(len(v["max"])):
            out.append(f"    row {r0 + i}: max {fmt(v['max'][i])}, exp(S - max) = {fmt(v['exp'][i])}, "
                       f"sum {fmt(v['sum'][i])}, P = {fmt(v['P'][i])}")
    o = result.outputs["O"].reshape(wl.seq_len_q, wl.head_dim)
    out.append("  O = P V (kernel gemm_pv reads P again):")
    out.append(_matrix("O", o))
    out += ["", "  Global-memory bytes each kernel moved (L2 side, as the kernels asked; counters of this run):"]
    out += _bytes_by_kernel(result)
    total = sum(k.total("read") + k.total("write") for k in result.kernels)
    out.append(f"  in all {total} B, of which S and P make {sum(_nn_bytes(k) for k in result.kernels)} B: "
               "they grow as N^2")
    return out, o, softmax_in


def _nn_bytes(kernel) -> int:
    return sum(t.read + t.write for name, t in kernel.tensors.items() if name in ("S", "P"))


def flash_part(ex: Example, gpu) -> tuple[list, dict]:
    wl, data = ex.workload(), ex.data()
    notes = Notes()
    result = simulate(gpu, flash2_training(wl, ex.block_q, ex.block_kv, data, (ex.block_q, ex.block_kv), (4, 8)),
                      trace=notes.trace, listener=notes.note)
    out = [f"2. Flash attention (flash2), query blocks of {ex.block_q}, key/value blocks of {ex.block_kv}: "
           "S and P never leave the chip", ""]
    described = notes.described(FLASH2_NOTES)
    for kernel, block in sorted({(n[1], n[2]) for n in described}, key=lambda kb: kb[1]):
        mine = [n for n in described if n[1:3] == (kernel, block)]
        rows = mine[0][4]["rows"]
        out.append(f"  query rows {rows[0]}..{rows[1] - 1} (thread block {block}):")
        out += [f"    t = {t * 1e9:8.3f} ns  load {what}"
                for t, _, k, b, what in notes.loads if (k, b) == (kernel, block)]
        for *_, what, values in mine:
            out += render(FLASH2_NOTES[what], values, "    ")
    fwd = [k for k in result.kernels if k.pass_name == "forward"]
    moved = sum(k.total("read") + k.total("write") for k in fwd)
    out.append(f"  Global-memory bytes of the forward: {moved} B (Q, K, V read, O and the log-sum-exp written; "
               "K and V once per query block)")
    return out, {"result": result, "notes": notes}


def backward_part(ex: Example, flash: dict) -> list:
    notes, result = flash["notes"], flash["result"]
    wl = ex.workload()
    out = ["3. The backward pass (flash2): P is recomputed from the log-sum-exp, never read", ""]
    for *_, what, values in notes.described(FLASH2_BACKWARD_NOTES):
        out += render(FLASH2_BACKWARD_NOTES[what], values, "  ")
    for name in ("dQ", "dK", "dV"):
        out.append(_matrix(f"final {name}", result.outputs[name].reshape(-1, wl.head_dim)))
    return out


def softmax_part(ex: Example, gpu, s: np.ndarray) -> list:
    """Softmax of the scores standard attention's softmax kernel read (scaled, masked), on its own: how
    many passes over global memory each form needs."""
    out = ["4. Softmax on its own: passes over global memory (input: the scores of part 1's softmax kernel)", ""]
    x = s[None]
    for kind, passes in (("safe", "max, then sum of exps, then write: 3 reads"),
                         ("online", "running max and rescaled sum in one read, then write: 2 reads")):
        notes = Notes()
        r = simulate(gpu, softmax_program(kind, Tensor("X", x.shape, ex.dtype, x.copy()), ex.block_kv),
                     listener=notes.note)
        t = r.kernels[0].tensors
        out.append(f"  {kind} softmax ({passes}): X {t['X'].read} B read, Y {t['Y'].write} B written, "
                   f"{r.time_s * 1e9:.1f} ns predicted")
        for *_, what, values in notes.described(SOFTMAX_NOTES, block=0):      # block 0: row 0
            out += render(SOFTMAX_NOTES[what], values, "    ")
    out.append("  fused into attention (flash2): 0 B: the scores never leave the chip (part 2)")
    return out


def explain(ex: Example, gpu) -> str:
    """The whole walkthrough as text."""
    wl, data = ex.workload(), ex.data()
    o_ref, _ = attention_forward(wl, data)
    o_ref = o_ref.reshape(wl.seq_len_q, wl.head_dim)
    grads = attention_backward(wl, data, data.d_o)
    lines = [f"Attention on {ex.source}: N_q = {wl.seq_len_q}, N_kv = {wl.seq_len_kv}, head dim {wl.head_dim}, "
             f"scale {ex.scale:g}{', causal' if ex.causal else ''}, stored as {ex.dtype}, on {gpu.name}",
             "(values from the simulated programs; times predicted by hbmsim)", ""]
    std, o_std, softmax_in = standard_part(ex, gpu)
    fl, flash = flash_part(ex, gpu)
    o_flash = flash["result"].outputs["O"].reshape(wl.seq_len_q, wl.head_dim)
    lines += std + [""] + fl + ["", f"  O_flash - O_standard: max |difference| {np.max(np.abs(o_flash - o_std)):.1e}; "
                                    f"against the float64 reference {np.max(np.abs(o_flash - o_ref)):.1e}", ""]
    lines += backward_part(ex, flash)
    worst = max(float(np.max(np.abs(flash["result"].outputs[n].reshape(grads[n].shape) - grads[n])))
                for n in ("dQ", "dK", "dV"))
    lines.append(f"  dQ, dK, dV against the float64 reference: max |difference| {worst:.1e}")
    lines += [""] + softmax_part(ex, gpu, softmax_in)
    return "\n".join(lines)


# `hbmsim explain --decode`: one query row against 8 keys, head dim 4, scale 1, K/V blocks of 2
# split in 2 (FA2's split-KV, algorithms/flash2_splitkv.py): the worked example's first query row
# and its 4 keys, then 4 keys it scores lower (so the two splits weigh differently); V = 1..32.
DECODE_Q = [DEFAULT_Q[0]]
DECODE_K = DEFAULT_K + [[0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]]
DECODE_V = [[4 * i + j + 1 for j in range(4)] for i in range(8)]


def decode_example(**options) -> Example:
    q, k, v = (np.array(a, dtype=float) for a in (DECODE_Q, DECODE_K, DECODE_V))
    options.setdefault("source", "the decode example (1 query row, 8 keys)")
    return Example(q, k, v, np.ones_like(q), **options)


def decode_part(ex: Example, gpu, num_splits: int = 2) -> tuple[list, dict]:
    """A decode step through FA2's split-KV kernel and its combine: each split's tiles (S, the
    running m, l and O), its fp32 partial O and log-sum-exp, then the combine's weights and O."""
    from hbmsim.algorithms.flash2_splitkv import NOTES as SPLIT_NOTES
    from hbmsim.algorithms.flash2_splitkv import flash2_splitkv_forward, split_blocks
    wl, data = ex.workload(), ex.data()
    notes = Notes()
    result = simulate(gpu, flash2_splitkv_forward(wl, ex.block_q, ex.block_kv, num_splits, data),
                      trace=notes.trace, listener=notes.note)
    out = [f"Decode step: split-KV (Flash-Decoding, FA2's flash_fwd_splitkv_kernel + combine): {wl.seq_len_q} query "
           f"row(s) x {wl.seq_len_kv} keys in {num_splits} splits, query blocks of {ex.block_q}, K/V blocks of "
           f"{ex.block_kv}", ""]
    tm = -(-wl.seq_len_q // ex.block_q)
    for block in range(num_splits * tm):
        s, i = divmod(block, tm)
        r1 = min(wl.seq_len_q, (i + 1) * ex.block_q)
        lo, hi = split_blocks(wl, r1, s, num_splits, ex.block_kv)
        span = (f"keys {lo * ex.block_kv}..{min(wl.seq_len_kv, hi * ex.block_kv) - 1}" if lo < hi
                else "no keys: writes O_s = 0, lse_s = -inf")
        out.append(f"  split {s}, query rows {i * ex.block_q}..{r1 - 1} (thread block {block}): {span}")
        out += [f"    t = {t * 1e9:8.3f} ns  load {what}" for t, _, k, b, what in notes.loads
                if k == "flash2_fwd_splitkv" and b == block]
        for _, kernel, b, what, values in notes.notes:
            if kernel == "flash2_fwd_splitkv" and b == block and what in SPLIT_NOTES:
                out += render(SPLIT_NOTES[what], values, "    ")
    if num_splits > 1:
        out.append("  combine kernel (reads every split's lse_s and O_s, writes O and lse):")
        for _, kernel, b, what, values in notes.notes:
            if what == "combine":
                out += render(SPLIT_NOTES[what], values, "    ")
    out += ["", "  Global-memory bytes each kernel moved (L2 side, counters of this run):"] + _bytes_by_kernel(result)
    return out, {"result": result, "notes": notes}


def explain_decode(ex: Example, gpu, num_splits: int = 2) -> str:
    """`hbmsim explain --decode`: the decode walkthrough, O checked against the float64 reference."""
    wl, data = ex.workload(), ex.data()
    o_ref, _ = attention_forward(wl, data)
    lines = [f"Decode attention on {ex.source}: N_q = {wl.seq_len_q}, N_kv = {wl.seq_len_kv}, head dim "
             f"{wl.head_dim}, scale {ex.scale:g}{', causal' if ex.causal else ''}, stored as {ex.dtype}, on {gpu.name}",
             "(values from the simulated programs; times predicted by hbmsim)", ""]
    part, run = decode_part(ex, gpu, num_splits)
    o = run["result"].outputs["O"].reshape(wl.seq_len_q, wl.head_dim)
    lines += part + [_matrix("O", o), f"  O against the float64 reference: max |difference| "
                     f"{np.max(np.abs(o - o_ref.reshape(o.shape))):.1e}"]
    return "\n".join(lines)
