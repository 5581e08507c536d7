"""`hbmsim explain --hopper`: what FlashAttention-3 gains over FlashAttention-2 on the same bytes.

One head of N = 1024 keys, head dim 128, fp16, on the H100 preset: both programs cut it into 8
query blocks of 128 rows (one thread block per SM), move the same bytes, and do the same FLOPs
(FA3 in K/V tiles of 128 keys, which divide N: FA3_BLOCK_KV).
The walk-through prints
1. the two runs' counters side by side (the same bytes) and their predicted kernel times;
2. one block's work, by hand: the GEMM FLOPs at mma.sync's measured rate (FA2) and at wgmma's
   (FA3), the softmax's vector and SFU time, and how the time model adds them up;
3. FA3's block 0 on SM 0 as its warp roles ran it (the producer's TMA loads, each consumer
   warpgroup's wgmma GEMMs and softmax), from the run's timeline;
4. how long SM 0's tensor and vector work took, and for how long both at once (none: measured,
   a Hopper SM's tensor pipe and its special-function unit do not work at the same time);
5. the same at scale, by hand: FA2's kernel holds two blocks an SM, and a step of theirs takes the
   SM for its GEMM and then the issue of every warp instruction (warp_issue).
Every number comes from the two simulations (predicted, not measured).
"""
from __future__ import annotations

from hbmsim.algorithms.flash2 import pv_work, qk_softmax_work, warp_instructions
from hbmsim.algorithms.flash2_spec import FA2_FWD_STEP_INSTRUCTIONS
from hbmsim.algorithms.workload import Workload
from hbmsim.simulator import TimeModel, simulate
from hbmsim.simulator.time_model import MMA_SYNC, WGMMA, SmRates
from hbmsim.simulator.timeline import PID_SMS, Timeline

from .experiment import Config, Experiment, RunSpec
from .runner import build_program, prepare

HARDWARE = "h100-sxm5-80gb"
WORKLOAD = Workload(1, 1, 1024, 1024, 128)      # one head: 8 query blocks of 128 rows, one per SM
FIRST_EVENTS = 14                               # FA3 block 0's events printed
# FA3's K/V tiles here: 128 keys, which divide N. Its kernel's own without a mask, 176, would run the
# last of 6 tiles 32 keys past N = 1024 (FA3 computes whole tiles: programs.md), 3% more FLOPs than FA2.
# One split: FA3's own rule would split this lone head's 8 query blocks over 6 blocks each (split-KV,
# inference.md), which is not the comparison this walk-through draws
FA3_BLOCK_KV = 128


def _run(gpu, algorithm: str, variant: str | None, **fields):
    params = {**({"variant": variant} if variant else {}), **fields}
    cfg = prepare(Experiment("explain", "explain --hopper", gpu,
                             [Config(gpu, WORKLOAD, RunSpec(algorithm, ("forward",), params))])).configs[0]
    timeline = Timeline()
    result = simulate(gpu, build_program(cfg), model=TimeModel(), recorder=timeline)
    return cfg, result, timeline


def _union_s(intervals: list) -> list:
    """The union of (start, end) intervals, as sorted disjoint intervals."""
    out: list = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _overlap_s(x: list, y: list) -> float:
    """Seconds during which both unions of intervals are busy."""
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in x for c, d in y)


def _sm0_compute(timeline: Timeline) -> tuple[list, list]:
    """SM 0's compute calls, (start_s, end_s), split into GEMMs (tensor pipe) and the rest (vector)."""
    tracks = {0} | {tid for (sm, _), tid in timeline.roles.items() if sm == 0}
    calls = [e for e in timeline.events if e["pid"] == PID_SMS and e["tid"] in tracks and e["cat"] == "compute"]
    span = lambda e: (e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6)
    return ([span(e) for e in calls if e["args"].get("matmul_flops")],
            [span(e) for e in calls if not e["args"].get("matmul_flops")])


def _role_events(timeline: Timeline) -> list:
    """FA3 block 0's events on SM 0's role tracks, in start order: (start_s, end_s, role, what)."""
    role_of = {tid: role for (sm, role), tid in timeline.roles.items() if sm == 0}
    out, loads = [], {}
    for e in timeline.events:
        if e["pid"] != PID_SMS or e["tid"] not in role_of or e["args"].get("block") != 0:
            continue
        a = e["args"]
        if e["cat"] == "compute":
            what = (f"wgmma GEMM, {a['matmul_flops']:,} FLOP" if a.get("matmul_flops")
                    else f"softmax, {a['vector_flops']:,} vector ops ({a['exp_ops']:,} exp)")
        else:                                     # the producer's TMA loads: K_0, V_0, K_1, ...
            loads[e["name"]] = loads.get(e["name"], -1) + 1
            what = f"{e['name']}_{loads[e['name']]} ({a['l2_bytes'] + a['hbm_bytes']:,} B)"
        out.append((e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6, role_of[e["tid"]], what))
    return sorted(out)


def explain_hopper(gpu) -> str:
    """The whole walk-through as text (gpu: the H100 preset, or any GPU with wgmma)."""
    wl = WORKLOAD
    fa2_cfg, fa2, tl2 = _run(gpu, "flash2", "fa2-kernel")
    fa3_cfg, fa3, tl3 = _run(gpu, "flash3", None, block_kv=FA3_BLOCK_KV, num_splits=1)
    lines = [f"FlashAttention-3 against FlashAttention-2 on the same bytes: {gpu.name}, batch {wl.batch}, "
             f"{wl.heads} head, N = {wl.seq_len_q}, head dim {wl.head_dim}, {wl.dtype} "
             "(every number predicted by hbmsim)", "",
             "1. The same bytes (each run's own counters)",
             f"  {'':28s}{'FA2 (flash2, fa2-kernel)':>26s}{'FA3 (flash3)':>16s}"]
    rows = (("L2-side reads (B)", "global_read_bytes"), ("L2-side writes (B)", "global_write_bytes"),
            ("DRAM reads (B)", "hbm_read_bytes"), ("DRAM writes (B)", "hbm_write_bytes"),
            ("matmul FLOPs", "matmul_flops"), ("exps", "exp_ops"))
    d2, d3 = fa2.to_dict("forward"), fa3.to_dict("forward")
    for label, key in rows:
        lines.append(f"  {label:28s}{d2[key]:>26,}{d3[key]:>16,}")
    t2, t3 = d2["kernel_time_s"], d3["kernel_time_s"]
    lines += [f"  {'kernel time (predicted, us)':28s}{t2 * 1e6:>26.2f}{t3 * 1e6:>16.2f}   FA3 {t2 / t3:.2f}x faster",
              f"  blocks: FA2 {fa2.kernels[0].grid} of {fa2_cfg.mapping.block_q} query rows, FA3 "
              f"{fa3.kernels[0].grid} of {fa3_cfg.mapping.block_q}: one per SM", ""]

    # 2. one block's work by hand: the same FLOPs, different instructions
    rates = SmRates(gpu, TimeModel())
    bq = fa3_cfg.mapping.block_q
    flops = 2 * 2 * bq * wl.seq_len_kv * wl.head_dim      # S = Q K^T and O += P V: 2 n N d FLOPs each
    mma_s, wgmma_s = flops * rates.s_per_flop[MMA_SYNC], flops * rates.s_per_flop[WGMMA]
    per_block = lambda r, attr: getattr(r.kernels[0], attr) / r.kernels[0].grid      # block 0's share
    operands_s = per_block(fa2, "sram_read_bytes") * rates.s_per_sram_byte
    vec2, exp2 = per_block(fa2, "vector_flops"), per_block(fa2, "exp_ops")
    vec3, exp3 = per_block(fa3, "vector_flops"), per_block(fa3, "exp_ops")
    _, softmax2_s = rates.compute_s(MMA_SYNC, 0, round(vec2), round(exp2), 0)
    _, softmax3_s = rates.compute_s(WGMMA, 0, round(vec3), round(exp3), 0)
    lines += ["2. One block's work, by hand (its share of the run's counters)",
              f"  GEMMs S = Q K^T and O += P V: 2 x 2 x {bq} x {wl.seq_len_kv} x {wl.head_dim} = {flops:,} FLOP "
              f"(K/V tiles of {fa2_cfg.mapping.block_kv} keys in FA2, {fa3_cfg.mapping.block_kv} in FA3: its kernel's "
              "176 would compute 32 keys past N)",
              f"  FA2, mma.sync: {gpu.mma_sync_fraction:g} (measured) x {gpu.matmul_flops_per_s / 1e12:.1f} TFLOP/s / "
              f"{gpu.sm_count} SMs = {1 / rates.s_per_flop[MMA_SYNC] / 1e12:.2f} TFLOP/s an SM: {mma_s * 1e6:.2f} us",
              f"       + ldmatrix operand reads, {per_block(fa2, 'sram_read_bytes'):,.0f} B at "
              f"{gpu.sram_bytes_per_s_per_sm / 1e12:.2f} TB/s an SM: {operands_s * 1e6:.2f} us (on H100 they add up "
              "with mma.sync: mma_operands)",
              f"       + softmax, {vec2:,.0f} vector ops of which {exp2:,.0f} exps (FP32 lanes, SFU): "
              f"{softmax2_s * 1e6:.2f} us (each warp's softmax needs its S: serial_softmax)",
              f"       = {(mma_s + operands_s + softmax2_s) * 1e6:.2f} us, one after the other: a lone block's "
              "chain (two resident blocks take the SM for the longer of", "         mma.sync and ldmatrix, then "
              "all their warps' instructions at 4 a clock, one block after the other: warp_issue)",
              f"  FA3, wgmma: {gpu.matmul_flops_per_s / 1e12:.1f} TFLOP/s / {gpu.sm_count} SMs = "
              f"{1 / rates.s_per_flop[WGMMA] / 1e12:.2f} TFLOP/s an SM, the full rate (wgmma_full_rate: Nsight "
              f"Compute counts a Hopper attention kernel's wgmma at 96-98% of it while busy): {wgmma_s * 1e6:.2f} us",
              "       (operands straight from shared memory, read under the GEMM)",
              f"       + softmax, {vec3:,.0f} vector ops of which {exp3:,.0f} exps: {softmax3_s * 1e6:.2f} us, "
              "not under the GEMMs: measured, the SM's tensor pipe and its",
              "       special-function unit work one after the other, whichever warpgroup asks (xu_tensor_serial)", ""]

    # 3. FA3's block 0 by warp role
    lines.append(f"3. FA3's block 0 on SM 0, by warp role (its first {FIRST_EVENTS} events; us from the "
                 "kernel's start)")
    for start_s, end_s, role, what in _role_events(tl3)[:FIRST_EVENTS]:
        lines.append(f"  {start_s * 1e6:7.3f} - {end_s * 1e6:7.3f}  {role:11s} {what}")
    lines += ["  The producer's TMA loads run ahead into the ring of K/V stages; each consumer warpgroup (64 of "
              "the block's rows)", "  issues S_j = Q K_j^T on wgmma, then its softmax, then P_j V_j; the "
              "ping-pong barrier hands the SM", "  to the other warpgroup, whose GEMMs follow this one's softmax "
              "(xu_tensor_serial; `--without xu_tensor_serial`: the overlap the FA3 paper draws).", ""]

    # 4. the pipes on SM 0
    gemm, soft = _sm0_compute(tl3)
    g, s = _union_s(gemm), _union_s(soft)
    busy = lambda u: sum(b - a for a, b in u)
    gemm2, soft2 = _sm0_compute(tl2)
    lines += ["4. SM 0's pipes (from each run's timeline)",
              f"  FA2: compute busy {busy(_union_s(gemm2 + soft2)) * 1e6:.2f} us of {t2 * 1e6:.2f} us: "
              "GEMMs and softmax one after the other (one block an SM)",
              f"  FA3: tensor pipe busy {busy(g) * 1e6:.2f} us, vector pipe {busy(s) * 1e6:.2f} us, both at once "
              f"{_overlap_s(g, s) * 1e6:.2f} us, of {t3 * 1e6:.2f} us",
              "  Same bytes, same FLOPs: FA3 is faster because wgmma runs at the full tensor rate (FA2's mma.sync "
              f"gets {gpu.mma_sync_fraction:g} of it)",
              "  and reads its operands from shared memory itself (FA2's ldmatrix reads add up with mma.sync on "
              "H100), not because the softmax hides under the GEMMs.",
              "  (How much faster is the model's claim: against the FA3 paper's H100 figures, docs/validation.md.)"]
    lines += _at_scale(gpu, fa2_cfg.mapping, rates, (wgmma_s + softmax3_s) / (bq * wl.seq_len_kv), t2 / t3)
    return "\n".join(lines)


def _at_scale(gpu, m2, rates: SmRates, fa3_s_per_score: float, lone_speedup: float) -> list:
    """5. FA2 with two blocks an SM (its kernel's 255 registers a thread leave room for two), by hand:
    a K/V step takes the SM for the longer of its mma.sync and ldmatrix, then its warps' instructions
    at the schedulers' rate (warp_issue); FA3's step (one block an SM) as in section 2."""
    wl = WORKLOAD
    counted = warp_instructions(wl, FA2_FWD_STEP_INSTRUCTIONS.get(wl.head_dim, ()), m2.block_q, m2.block_kv, m2.warps)
    if not counted or not rates.s_per_warp_instruction:
        return []
    # a step's two calls: S = Q_i K_j^T and its softmax; P V_j (every warp reads all of V_j)
    calls = [(c["matmul_flops"], c["sram_bytes"], c.get("vector_flops", 0))
             for c in (qk_softmax_work(wl, m2.block_q, m2.block_kv, 1, m2.warps),
                       pv_work(wl, m2.block_q, m2.block_kv, m2.warps))]
    mma_s = sum(f * rates.s_per_flop[MMA_SYNC] for f, _, _ in calls)
    ldsm_s = sum(b * rates.s_per_sram_byte for _, b, _ in calls)
    instructions = sum(rates.call_instructions(counted, *c) for c in calls)
    step_s = sum(rates.issue_s(*c, counted) for c in calls)
    issue_s = instructions * rates.s_per_warp_instruction
    fa2_s_per_score = step_s / (m2.block_q * m2.block_kv)
    return ["", "5. At scale, by hand: many blocks, FA2's kernel two an SM (255 registers a thread), FA3's one",
            f"  FA2: a {m2.block_q} x {m2.block_kv} step takes the SM for the longer of mma.sync "
            f"({mma_s * 1e6:.2f} us) and ldmatrix ({ldsm_s * 1e6:.2f} us) in each GEMM,",
            f"       then its {m2.warps} warps' {instructions:,.0f} instructions at "
            f"{gpu.warp_instructions_per_clk_per_sm:g} a clock ({issue_s * 1e6:.2f} us): "
            f"{step_s * 1e6:.2f} us, {fa2_s_per_score * 1e9:.3f} ns a score,",
            "       the two blocks' steps one after the other (warp_issue: Nsight counts FA2's cycles a score as its "
            "tensor pipe's plus its issue)",
            f"  FA3: {fa3_s_per_score * 1e9:.3f} ns a score (section 2's GEMMs and softmax over its block's scores): "
            f"FA3 {fa2_s_per_score / fa3_s_per_score:.2f}x faster at scale, {lone_speedup:.2f}x for the lone "
            "blocks above",
            "  At scale FA2 loses by mma.sync's rate and by issuing its warps' instructions while its tensor pipe "
            "waits; its ldmatrix",
            "  reads hide under its mma.sync. (FA2's instructions: mma.sync and ldmatrix by their shapes, the rest "
            "Nsight's count a step: algorithms/flash2_spec.py)"]
