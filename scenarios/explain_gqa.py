"""`hbmsim explain --gqa`: FlashAttention-3's PackGQA on a small speculative step, by hand.

4 query heads share 1 K/V head (grouped-query attention); a step verifies 3 new tokens (1 query
row each) against a cache of 8 keys, head dim 4, causal, fp16, on the H100 preset. FA3 runs it
twice here, unpacked (a thread block per query head, 3 real rows in a 192-row tile) and packed
(pack_gqa.h: the group's 4 x 3 = 12 rows in one tile, row r = query row r // 4 of head r % 4).
The walk-through prints
1. FA3's rule (heuristics.h should_pack_gqa) with this shape's numbers;
2. the packed tile's rows, and the keys each sees under the causal mask (its query row's);
3. the loads of each run's thread blocks (the simulator's trace): Q head by head, K and V once
   per thread block, so 4 times unpacked and once packed;
4. both runs' counters side by side: the same Q and O bytes, K and V a quarter, the same 192-row
   tile computed once instead of 4 times; their predicted kernel times;
5. O against the float64 reference.
Every number comes from the two simulations (predicted, not measured).
"""
from __future__ import annotations

import numpy as np

from hbmsim.algorithms import registry
from hbmsim.algorithms.flash3_pack import PackGQA
from hbmsim.algorithms.flash3_spec import fa3_forward_tiles
from hbmsim.algorithms.reference import attention_forward
from hbmsim.algorithms.workload import Workload, causal_kv_end, random_data
from hbmsim.simulator import simulate

HARDWARE = "h100-sxm5-80gb"
WORKLOAD = Workload(1, 4, 3, 8, 4, dtype="fp16", causal=True, kv_heads=1)
SEED = 3
# a serving-sized step of the same kind (section 6): 4 speculative tokens, Llama-3-8B-like heads
AT_SCALE = Workload(8, 32, 4, 16384, 128, dtype="fp16", causal=True, kv_heads=8)


def _run(gpu, wl: Workload, data, pack: bool):
    spec = registry.get("flash3")
    m, _ = spec.resolved(gpu, wl, spec.mapping_type(pack_gqa=pack, num_splits=1), False)
    loads: list = []

    def trace(t, sm, kernel, block, what):
        loads.append((block, what))

    return m, simulate(gpu, spec.build(wl, m, data, False), trace), loads


def explain_gqa(gpu) -> str:
    """The whole walk-through as text (gpu: the H100 preset, or any GPU with wgmma)."""
    wl, data = WORKLOAD, random_data(WORKLOAD, SEED)
    ratio, nq, nk = wl.group_size, wl.seq_len_q, wl.seq_len_kv
    block_m = fa3_forward_tiles(wl.head_dim, wl.causal, False)[0]
    lines = [f"FlashAttention-3's PackGQA by hand: {wl.heads} query heads sharing {wl.kv_heads} K/V head, "
             f"{nq} query rows (a speculative step) against {nk} keys, head dim {wl.head_dim}, causal, {wl.dtype}, "
             f"on {gpu.name}", "(every number from the simulated programs; times predicted by hbmsim)", ""]

    # 1. FA3's rule: the tile's row efficiency, unpacked against packed
    up, pk = nq / (-(-nq // block_m) * block_m), nq * ratio / (-(-nq * ratio // block_m) * block_m)
    lines += [f"1. FA3's rule (hopper/heuristics.h should_pack_gqa), tiles of kBlockM = {block_m} rows:",
              f"  unpacked: {nq} rows in a {block_m}-row tile, efficiency {nq}/{block_m} = {up:.4f}",
              f"  packed:   {nq} x {ratio} = {nq * ratio} rows in a {block_m}-row tile, efficiency "
              f"{nq * ratio}/{block_m} = {pk:.4f}",
              f"  {up:.4f} < 0.9 x {pk:.4f} = {0.9 * pk:.4f}: pack", ""]

    # 2. the packed rows and the keys each sees
    lines.append(f"2. The packed tile's rows (hopper/pack_gqa.h: row r = query row r // {ratio} of head r % {ratio}); "
                 f"under the causal mask a row sees its query row's keys, 0..q + {nk - nq} (hopper/mask.h)")
    for r in range(nq * ratio):
        q, h = divmod(r, ratio)
        lines.append(f"  row {r:2d}: head {h}, query row {q}, keys 0..{causal_kv_end(wl, q + 1) - 1}")
    lines.append("")

    # 3. the loads of each run's thread blocks
    runs = {pack: _run(gpu, wl, data, pack) for pack in (False, True)}
    for pack, title in ((False, "unpacked: a thread block per query head"),
                        (True, "packed: one thread block for the group")):
        m, res, loads = runs[pack]
        lines.append(f"3{'b' if pack else 'a'}. Loads, {title} ({res.kernels[0].grid} block"
                     f"{'s' if res.kernels[0].grid > 1 else ''} of {m.block_q} rows, "
                     f"K/V tiles of {m.block_kv} keys; the trace)")
        for block, what in loads:
            if what.startswith("load"):
                lines.append(f"  block {block}: {what}")
        lines.append("")

    # 4. the counters side by side
    (_, r0, _), (_, r1, _) = runs[False], runs[True]
    t0, t1 = r0.tensors("forward"), r1.tensors("forward")
    k0, k1 = r0.kernels[0], r1.kernels[0]
    lines += ["4. What each run moved and computed (its counters)", f"  {'':30s}{'unpacked':>12s}{'packed':>12s}"]
    for name in ("Q", "K", "V"):
        lines.append(f"  {name + ' read (B)':30s}{t0[name].read:>12,}{t1[name].read:>12,}")
    for name in ("O", "lse"):
        lines.append(f"  {name + ' written (B)':30s}{t0[name].write:>12,}{t1[name].write:>12,}")
    rows = PackGQA(wl, ratio).rows
    lines += [f"  {'matmul FLOPs':30s}{k0.matmul_flops:>12,}{k1.matmul_flops:>12,}",
              f"  {'kernel time (predicted, us)':30s}{(k0.end_s - k0.start_s) * 1e6:>12.3f}"
              f"{(k1.end_s - k1.start_s) * 1e6:>12.3f}",
              f"  FLOPs: each block computes its whole {block_m}-row tile against its keys' whole tile of "
              f"{runs[True][0].block_kv} (FA3's MMAs have no row or key bound):",
              f"  2 GEMMs x 2 x {block_m} x {runs[True][0].block_kv} x {wl.head_dim} = "
              f"{4 * block_m * runs[True][0].block_kv * wl.head_dim:,} a block; {k0.grid} blocks unpacked, "
              f"{k1.grid} packed ({nq} real rows a block unpacked, {rows} packed, of {block_m} computed)", ""]

    # 5. the output
    o_ref, _ = attention_forward(wl, data)
    worst = max(float(np.max(np.abs(r.outputs["O"].reshape(o_ref.shape) - o_ref))) for r in (r0, r1))
    lines += [f"5. O of both runs against the float64 reference: max |difference| {worst:.1e}", ""]

    # 6. the same at a serving size: where the time goes
    big = AT_SCALE
    lines.append(f"6. At scale: batch {big.batch}, {big.heads} query heads on {big.kv_heads} K/V heads, "
                 f"{big.seq_len_q} query rows against {big.seq_len_kv:,} keys, head dim {big.head_dim}, causal "
                 "(fast mode)")
    spec = registry.get("flash3")
    for label, fields in (("unpacked (FA3 packs every split: 1 split)", dict(pack_gqa=False, num_splits=1)),
                          ("packed, 1 split", dict(pack_gqa=True, num_splits=1)),
                          ("packed, FA3's split count", dict())):
        m, _ = spec.resolved(gpu, big, spec.mapping_type(**fields), False)
        res = simulate(gpu, spec.build(big, m, None, False, fast=True))
        d = res.to_dict("forward")
        lines.append(f"  {label:44s} {m.num_splits:>3d} split(s)  {d['global_read_bytes'] / 1e6:>8.1f} MB read "
                     f"(L2 side)  {d['kernel_time_s'] * 1e6:>8.1f} us of kernels (predicted)")
    lines.append("  unpacked, each query head reads its K/V head and computes a 128-row tile for 4 real rows; packed, "
                 "the K/V head is read once a block of 128 packed rows")
    return "\n".join(lines)
