"""Grouped-query and multi-query attention (Workload.kv_heads < heads): the kernels and closed
forms every program shares for it.

Query batch-head g = b * heads + h reads K/V batch-head wl.kv_group(g) = b * kv_heads +
h // (heads // kv_heads), as FlashAttention-2 indexes it (`h / h_h_k_ratio`).

- flash1 and flash2 read the shared K/V head directly: no copy, and the L2-side bytes of K and V
  are those of multi-head attention (each query head's blocks still request their K/V tiles);
  what kv_heads saves is DRAM bytes, since the query heads of a group run next to each other
  and find the tiles in L2. Their backward writes dK and dV per query head into expanded
  (B*heads, Nkv, d) buffers and then sums each group: FA2's mha_bwd allocates dk_expanded /
  dv_expanded when num_heads_k != num_heads and reduces them with at::sum_out over the group
  (`reduce_kv_grads`).
- standard attention, in all its variants, expands K and V to one copy per query head first,
  as PyTorch code does it: Hugging Face's `repeat_kv` (expand + reshape: a copy kernel) in the
  eager and pytorch-bench lists; flash-attention's tests' `attention_ref` repeats k and v with
  einops `repeat` (a copy) before its einsum; Megatron-LM's DotProductAttention
  `repeat_interleave`s key and value over the query groups. So `expands_kv` wraps each variant:
  the copy kernels (`repeat_kv_k`, `repeat_kv_v`, writing K_rep and V_rep), the multi-head program
  on the copies, and in training autograd's backward of the expand: a sum over each group of
  the expanded gradients dK_rep and dV_rep into dK and dV. The copy reads its source once per
  element written (a PyTorch copy of an expanded view), so K is requested heads / kv_heads times.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from hbmsim.simulator import Launch, Program, Tensor

from .workload import AttentionData, Workload, expand_kv

COPY_ROWS = 128        # rows of one block of the copy and the group-sum kernels (bytes do not depend on it)


def _add(io: dict, name: str, read: int = 0, write: int = 0) -> None:
    r, w = io.get(name, (0, 0))
    io[name] = (r + read, w + write)


def _chunks(n: int) -> list[slice]:
    return [slice(r, min(n, r + COPY_ROWS)) for r in range(0, n, COPY_ROWS)]


# ---- the backward's group sum (flash1, flash2, standard) ---------------------------------------

def kv_grad_tensors(wl: Workload, K: Tensor, V: Tensor, data: AttentionData | None,
                    suffix: str = "_expanded") -> tuple[Tensor, Tensor]:
    """The tensors a backward kernel writes dK and dV into: K's and V's own shape named dK, dV for
    multi-head attention; else one per query head, (B*heads, Nkv, d), named dK<suffix>, dV<suffix>."""
    count_only = data is None
    if wl.group_size == 1:
        return (Tensor("dK", K.shape, K.dtype, count_only=count_only),
                Tensor("dV", V.shape, V.dtype, count_only=count_only))
    shape = (wl.groups, wl.seq_len_kv, wl.head_dim)
    return (Tensor("dK" + suffix, shape, K.dtype, count_only=count_only),
            Tensor("dV" + suffix, shape, V.dtype, count_only=count_only))


def reduce_kv_grads(wl: Workload, dKx: Tensor, dVx: Tensor, data: AttentionData | None,
                    pass_name: str = "backward") -> tuple[list, dict]:
    """(launches, {"dK": .., "dV": ..}): nothing for multi-head attention (dKx, dVx are dK, dV);
    else a kernel per gradient summing each group's query heads into the K/V head's gradient
    (at::sum_out over the group, as FA2's mha_bwd does), freeing the expanded buffers."""
    if wl.group_size == 1:
        return [], {"dK": dKx, "dV": dVx}
    nk, d, r = wl.seq_len_kv, wl.head_dim, wl.group_size
    chunks = _chunks(nk)
    launches, grads = [], {}
    for src in (dKx, dVx):
        name = src.name.split("_")[0]
        dst = Tensor(name if src.dtype == wl.dtype else name + "32", (wl.kv_groups, nk, d), src.dtype,
                     count_only=data is None)

        def block(ctx, index, src=src, dst=dst):
            kg, c = divmod(index, len(chunks))
            rows = chunks[c]
            parts = yield from ctx.load_tiles(*[(src[kg * r + i], rows, slice(0, d)) for i in range(r)])
            yield from ctx.compute(vector_flops=(r - 1) * (rows.stop - rows.start) * d)
            total = None if parts[0] is None else np.sum(parts, axis=0)
            yield from ctx.store(dst[kg], rows, slice(0, d), total)
        launches.append(Launch(f"sum_{name}_groups", wl.kv_groups * len(chunks), 0, block, allocs=(dst,),
                               frees=(src,), pass_name=pass_name, period=len(chunks)))
        grads[name] = dst     # dK (dK32: an fp32 sum that attention_ref then casts to dK)
    return launches, grads


def reduce_kv_io(wl: Workload, io: dict, src_suffix: str = "_expanded", itemsize: int | None = None) -> dict:
    """The closed form of reduce_kv_grads added to `io` (and of the expanded buffers' writes,
    which the backward's own formula counts as dK, dV): nothing for multi-head attention; else
    dK, dV's writes become dK<suffix>, dV<suffix> (B*heads*Nkv*d*e each), which the group sum
    reads once and writes B*kv_heads*Nkv*d*e of dK, dV."""
    if wl.group_size == 1:
        return io
    e = wl.itemsize if itemsize is None else itemsize
    out = dict(io)
    for name in ("dK", "dV"):
        r, w = out.pop(name, (0, 0))
        _add(out, name + src_suffix, read=r, write=w)
        _add(out, name + src_suffix, read=wl.groups * wl.seq_len_kv * wl.head_dim * e)
        _add(out, name, write=wl.kv_groups * wl.seq_len_kv * wl.head_dim * e)
    return out


# ---- standard attention: repeat_kv before, the group sum after ---------------------------------

def repeat_launch(wl: Workload, src: Tensor, dst: Tensor) -> Launch:
    """dst[g] = src[kv_group(g)]: one block per (query batch-head, 128 rows), reading its source
    rows (each read once per query head of the group) and writing its copy."""
    nk, d = wl.seq_len_kv, wl.head_dim
    chunks = _chunks(nk)

    def block(ctx, index):
        g, c = divmod(index, len(chunks))
        rows = chunks[c]
        x = yield from ctx.load(src[wl.kv_group(g)], rows, slice(0, d))
        yield from ctx.compute(vector_flops=(rows.stop - rows.start) * d)
        yield from ctx.store(dst[g], rows, slice(0, d), x)
    return Launch(f"repeat_kv_{src.name.lower()}", wl.groups * len(chunks), 0, block, allocs=(dst,),
                  period=len(chunks))


def expands_kv(build):
    """Wrap a standard-attention program builder (wl, data, gemm_tile, ...) -> Program so that with
    kv_heads < heads it runs on K and V repeated per query head (see the module's docstring); the
    multi-head program unchanged otherwise."""
    @functools.wraps(build)
    def wrapped(wl: Workload, data: AttentionData | None = None, *args, **kwargs) -> Program:
        if wl.group_size == 1:
            return build(wl, data, *args, **kwargs)
        mha = dataclasses.replace(wl, kv_heads=wl.heads)
        mha_data = None if data is None else dataclasses.replace(data, k=expand_kv(wl, data.k), v=expand_kv(wl, data.v))
        if data is not None:
            data.check(wl)
        prog = build(mha, mha_data, *args, **kwargs)
        shape = (wl.kv_groups, wl.seq_len_kv, wl.head_dim)
        inputs, pre = [], []
        for t in prog.inputs:
            if t.name in ("K", "V"):
                src = Tensor(t.name, shape, t.dtype,
                             None if data is None else getattr(data, t.name.lower()).reshape(shape), data is None)
                t.name = t.name + "_rep"
                if t.data is not None:
                    t.data[...] = 0.0              # the copy kernel fills it
                inputs.append(src)
                pre.append(repeat_launch(wl, src, t))
            else:
                inputs.append(t)
        outputs = dict(prog.outputs)
        post = []
        if "dK" in outputs:
            for name in ("dK", "dV"):
                outputs[name].name = name + "_rep"
            post, grads = reduce_kv_grads(wl, outputs["dK"], outputs["dV"], data)
            outputs.update(grads)
        return Program(prog.name, pre + list(prog.launches) + post, inputs=tuple(inputs), outputs=outputs)
    return wrapped


def expands_kv_io(formula, pass_name: str):
    """Wrap a standard variant's closed form (wl, gemm_tile) -> {tensor: (read, write)} to match
    expands_kv: the multi-head formula with K, V (and dK, dV) renamed K_rep, V_rep (dK_rep,
    dV_rep), plus, in the forward, the copies (K and V read B*heads*Nkv*d*e each, as many bytes
    written to K_rep, V_rep) and, in the backward, the group sums (reduce_kv_io)."""
    @functools.wraps(formula)
    def wrapped(wl: Workload, *args, **kwargs) -> dict:
        if wl.group_size == 1:
            return formula(wl, *args, **kwargs)
        io = formula(dataclasses.replace(wl, kv_heads=wl.heads), *args, **kwargs)
        out: dict = {}
        rename = {"K": "K_rep", "V": "V_rep"}
        for name, (r, w) in io.items():
            _add(out, rename.get(name, name), r, w)
        if pass_name == "forward":
            nbytes = wl.groups * wl.seq_len_kv * wl.head_dim * wl.itemsize
            for name in ("K", "V"):
                _add(out, name, read=nbytes)
                _add(out, name + "_rep", write=nbytes)
            return out
        return reduce_kv_io(wl, out, "_rep")
    return wrapped
