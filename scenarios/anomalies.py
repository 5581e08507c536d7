"""`hbmsim anomalies`: how often, and by how much, a bigger GPU is predicted slower.

More bandwidth, or more SMs of the same kind, can make a list-scheduled program slower: which
blocks end up in the last wave, and how in step resident blocks load and compute, change with
the machine (Graham's scheduling anomalies; real block schedulers show them too). hbmsim does
not hide this, it measures it: random small workloads, block sizes and GPUs derived from a
preset, each simulated three times (base, 1.5x HBM bandwidth, more SMs with whole-GPU compute
rates scaled alike), for each program.

A trial's blocks are drawn without regard to SRAM: a program whose blocks do not fit the GPU
(flash1's backward with 128 x 128 blocks at head dim 128, say) is skipped for that trial and
counted in `skipped`, with the first reason per program; the other programs still run. The three
GPUs of a trial share their SRAM, registers and HBM, so a program fits all three or none.

More bandwidth can be slower too, with the same bytes and the same compute: under a causal mask
the last query blocks of a head are the longest, and when faster loads free two slots of one SM
at nearly the same moment, two of those long blocks land there and share its pipe, where the
base GPU spread them over two SMs (`tests/test_anomalies.py` pins such a case).
"""
from __future__ import annotations

import dataclasses
import random
import sys

from hbmsim.algorithms import registry
from hbmsim.algorithms.workload import Workload
from hbmsim.simulator import GPU, HbmsimError, check_program, simulate


def programs(bq: int, bkv: int) -> dict:
    """Every registered program's forward (its default mapping, with the trial's flash blocks
    where it has block fields), and the training step of those that have a backward."""
    out = {}
    for spec in registry.algorithms():
        fields = {"block_q": bq, "block_kv": bkv}
        mapping = spec.mapping_type(**{k: v for k, v in fields.items() if k in spec.mapping_fields})
        out[spec.name] = (spec, mapping, False)
        if "backward" in spec.passes and spec.auto_fields:
            out[f"{spec.name} training"] = (spec, mapping, True)
    return out


def trial_config(rng: random.Random, base: GPU) -> tuple:
    """One trial's (workload, GPU, block_q, block_kv, SM count of the bigger GPU), drawn from `rng`."""
    wl = Workload(rng.randint(1, 3), rng.randint(1, 8), rng.randint(16, 600), rng.randint(16, 600),
                  rng.choice([32, 64, 128]), causal=rng.random() < 0.5)
    gpu = base if rng.random() < 0.5 else dataclasses.replace(base, l2_bytes=0, l2_bytes_per_s=0.0)
    gpu = gpu.with_sms(rng.randint(4, 40))
    bq, bkv = rng.choice([16, 32, 64, 128]), rng.choice([16, 32, 64, 128])
    return wl, gpu, bq, bkv, gpu.sm_count + rng.randint(1, 20)


def fitting_build(spec, mapping, training: bool, gpu: GPU, wl: Workload):
    """A function building a fresh program (one per run) of what the trial left "auto" resolved
    on `gpu`; raises HbmsimError, before simulating anything, when its blocks do not fit."""
    mapping = spec.resolved(gpu, wl, mapping, training)[0]
    build = lambda: spec.build(wl, mapping, None, training)
    check_program(gpu, build())
    return build


def measure(base: GPU, trials: int = 40, seed: int = 1, progress: bool = True) -> dict:
    rng = random.Random(seed)
    cases = violations = skipped = 0
    worst, reasons = [], {}
    for trial in range(trials):
        wl, gpu, bq, bkv, more_sms = trial_config(rng, base)
        for name, (spec, mapping, training) in programs(bq, bkv).items():
            try:
                build = fitting_build(spec, mapping, training, gpu, wl)
            except HbmsimError as err:
                skipped += 1
                reasons.setdefault(name, str(err))
                continue
            t0 = simulate(gpu, build()).time_s
            t_bw = simulate(dataclasses.replace(gpu, hbm_bytes_per_s=1.5 * gpu.hbm_bytes_per_s), build()).time_s
            t_sm = simulate(gpu.with_sms(more_sms), build()).time_s
            for what, t in (("1.5x bandwidth", t_bw), (f"{gpu.sm_count} -> {more_sms} SMs", t_sm)):
                cases += 1
                if t > t0 * (1 + 1e-9):
                    violations += 1
                    worst.append({"program": name, "change": what, "slowdown": t / t0 - 1, "l2": gpu.l2_bytes > 0,
                                  "workload": wl.describe(), "block_q": bq, "block_kv": bkv,
                                  "sm_count": gpu.sm_count})
        if progress:
            print(f"anomalies: {trial + 1}/{trials} trials, {violations} slower of {cases} changes"
                  + (f", {skipped} runs skipped (blocks do not fit)" if skipped else ""), file=sys.stderr, flush=True)
    worst.sort(key=lambda w: -w["slowdown"])
    return {"hardware": base.name, "trials": trials, "seed": seed, "changes": cases, "slower": violations,
            "slower_fraction": violations / cases if cases else 0.0,
            "max_slowdown": worst[0]["slowdown"] if worst else 0.0, "worst": worst[:5],
            "skipped": skipped, "skipped_why": reasons}
