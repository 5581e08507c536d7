"""`hbmsim emulate` and `hbmsim profile`: run the real kernel over an experiment's configurations
and write a measurement file (JSON with provenance) that `hbmsim compare` reads.

emulate runs the CUDA source on the CPU (kernels/emulation.py) and records L2-side bytes only,
labelled "emulated"; profile runs it on a GPU through CuPy (and ncu when present), labelled
"measured", under a stated L2 starting state (--l2 cold|warm: the provenance's "l2" and each
run's "l2_start"). Configurations no kernel can run are listed under "skipped" with the reason.
profile without an experiment sweeps a block grid instead (scenarios/profile_grid.py).
"""
from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np

from hbmsim.simulator import HbmsimError

from .experiment import load_experiment
from .runner import prepare
from .outputs import check_output_path, write_text_atomic


def _kernel_plan(exp, emulated: bool) -> tuple[list, list]:
    """(cfg, RunSpec) for each configuration a real kernel can run (with `emulated`, only those
    whose kernel the CPU emulation counts), and the skipped ones with why."""
    from hbmsim.kernels.profile import RunSpec
    from hbmsim.kernels.profile_grid import takes_warps
    from .runner import resolved_mapping, workload_dict

    plan, skipped = [], []
    for cfg in exp.configs:
        wl, spec = cfg.workload, cfg.run.spec
        why = None
        if spec.kernel is None:
            why = spec.no_kernel_reason
        elif emulated and not spec.emulated:
            why = spec.no_emulation_reason
        elif "forward" not in cfg.run.passes:
            why = "the kernels run the forward pass only"
        elif wl.key_padding_mask or wl.dropout > 0:
            why = "the kernels implement the causal mask only (no key padding, no dropout)"
        run = None
        if why is None:
            mp = resolved_mapping(cfg)
            kernel = spec.kernel_of(mp)           # the variant's own kernel (rawkernel-tc: the tensor-core one)
            warps = getattr(mp, "warps", None) if takes_warps(kernel) else None
            run = RunSpec(kernel, wl.batch, wl.heads, wl.seq_len_q, wl.seq_len_kv, wl.head_dim, wl.dtype,
                          wl.causal, getattr(mp, "block_q", None), getattr(mp, "block_kv", None), wl.scale,
                          warps=warps if isinstance(warps, int) else None)
            try:
                if run.block_q is not None:
                    run.kernel_config()
                elif wl.dtype not in ("fp16", "fp32"):
                    raise HbmsimError(f"kernel: field 'dtype' = {wl.dtype!r} must be one of fp16, fp32")
            except HbmsimError as err:
                why = str(err)
        if why is None:
            plan.append((cfg, run))
        else:
            skipped.append({"algorithm": cfg.run.algorithm, "workload": workload_dict(wl), "reason": why})
    return plan, skipped


def _inputs(wl, seed: int = 0):
    """Random q, k, v in the storage dtype, and their float64 values for the reference."""
    from hbmsim.algorithms.workload import AttentionData, random_data
    from hbmsim.kernels.config import DTYPES

    d = random_data(wl, seed)
    q, k, v = (x.astype(DTYPES[wl.dtype][1]) for x in (d.q, d.k, d.v))
    return (q, k, v), AttentionData(q.astype(float), k.astype(float), v.astype(float))


def _max_error(wl, exact, o) -> float | None:
    """max |O - float64 reference|, or None when the reference's N x N arrays would not fit."""
    from hbmsim.algorithms.reference import attention_forward
    from .runner import NUMERICS_BUDGET_BYTES

    if 8 * 4 * wl.groups * wl.seq_len_q * wl.seq_len_kv > NUMERICS_BUDGET_BYTES:
        return None
    o_ref, _ = attention_forward(wl, exact)
    return float(np.max(np.abs(o.astype(float) - o_ref)))


def _run_record(cfg, run, source: str) -> dict:
    """The configuration part of a measured run, named as `hbmsim run` names it (for compare)."""
    from .runner import workload_dict
    rec = {"algorithm": cfg.run.algorithm, "pass": "forward", "source": source, "workload": workload_dict(cfg.workload)}
    mp = dataclasses.asdict(cfg.mapping) if cfg.mapping is not None else {}
    rec.update({k: mp[k] for k in cfg.run.spec.match_fields if k in mp})
    variant = cfg.run.spec.variant_modelling(run.kernel)     # what models the kernel that ran (validate reads it)
    if variant is not None:
        rec["variant"] = variant
    return rec


def _write_measurements(path: str, doc: dict) -> None:
    write_text_atomic(path, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path} ({len(doc['runs'])} run(s), source: {doc['source']})")


def _print_skipped(skipped: list) -> None:
    for s in skipped:
        w = s["workload"]
        print(f"skipped {s['algorithm']} N={w['seq_len_q']}x{w['seq_len_kv']} {w['dtype']}: {s['reason']}",
              file=sys.stderr)


def cmd_emulate(args) -> int:
    from hbmsim.kernels.emulation import compiler
    from hbmsim.kernels.profile import emulation_provenance, traffic_fields
    from hbmsim.kernels.profile_grid import emulation_configs, emulation_of

    check_output_path(args.out, "--out")
    exp = prepare(load_experiment(args.experiment))
    plan, skipped = _kernel_plan(exp, emulated=True)
    _print_skipped(skipped)
    if not plan:
        raise HbmsimError(f"emulate: {exp.path}: no configuration the emulated kernel can run (fp16/fp32, "
                          "head_dim 32/64/128, causal or no mask)")
    configs = emulation_configs([spec for _, spec in plan])     # the teaching kernel's, built once
    runs = []
    for i, (cfg, spec) in enumerate(plan):
        (q, k, v), exact = _inputs(cfg.workload, args.seed)
        o, traffic, smem = emulation_of(spec.kernel)(spec, q, k, v, configs)
        rec = _run_record(cfg, spec, "emulated")
        rec.update(traffic_fields(traffic), smem_bytes_per_block=smem, max_abs_error=_max_error(cfg.workload, exact, o))
        runs.append(rec)
        err = "n/a" if rec["max_abs_error"] is None else f"{rec['max_abs_error']:.1e}"
        print(f"[{i + 1}/{len(plan)}] {cfg.run.algorithm} {spec.dtype} N={spec.seq_len_q}x{spec.seq_len_kv} "
              f"d={spec.head_dim} "
              f"{spec.block_q}x{spec.block_kv}{' causal' if spec.causal else ''}: read {rec['global_read_bytes']:,} B, "
              f"write {rec['global_write_bytes']:,} B, max|O-ref| {err}", file=sys.stderr)
    command = ["hbmsim", "emulate", args.experiment, "--out", args.out, "--seed", str(args.seed)]
    doc = {"source": "emulated", "experiment": exp.name, "provenance": emulation_provenance(command, compiler()),
           "runs": runs, "skipped": skipped}
    _write_measurements(args.out, doc)
    return 0


def cmd_profile(args) -> int:
    import shutil
    from hbmsim.kernels.gpu import gpu_available
    from hbmsim.kernels.profile import gpu_provenance, measure_on_gpu

    check_output_path(args.out, "--out")
    exp = prepare(load_experiment(args.experiment))      # a missing experiment is said first
    ok, why = gpu_available()
    if not ok:
        raise HbmsimError(f"profile: no GPU to measure on ({why}); nothing was measured or written")
    plan, skipped = _kernel_plan(exp, emulated=False)
    _print_skipped(skipped)
    if not plan:
        raise HbmsimError(f"profile: {exp.path}: no configuration a kernel can run")
    ncu = None if args.no_ncu else shutil.which("ncu")
    if ncu is None:
        print("ncu not on the PATH (or --no-ncu): recording CUDA-event times only, no DRAM/L2 bytes", file=sys.stderr)
    command = ["hbmsim", "profile", args.experiment, "--out", args.out, "--l2", args.l2, "--warmup", str(args.warmup),
               "--repeats", str(args.repeats), "--seed", str(args.seed)] + (["--no-ncu"] if args.no_ncu else [])
    provenance = gpu_provenance(command, args.warmup, args.repeats, ncu, l2_start=args.l2)
    runs = []
    for i, (cfg, spec) in enumerate(plan):
        (q, k, v), exact = _inputs(cfg.workload, args.seed)
        try:
            m = measure_on_gpu(spec, q, k, v, warmup=args.warmup, repeats=args.repeats, ncu=ncu, l2_start=args.l2)
        except HbmsimError as err:        # e.g. more shared memory than this GPU has: keep the others
            skipped.append({"algorithm": cfg.run.algorithm, "workload": _run_record(cfg, spec, "")["workload"],
                            "reason": str(err)})
            print(f"[{i + 1}/{len(plan)}] skipped: {err}", file=sys.stderr)
            continue
        rec = {**_run_record(cfg, spec, "measured"), "hardware": provenance["gpu"]}
        rec["max_abs_error"] = _max_error(cfg.workload, exact, m.pop("o"))
        rec.update(m)
        runs.append(rec)
        print(f"[{i + 1}/{len(plan)}] {cfg.run.algorithm} N={spec.seq_len_q}x{spec.seq_len_kv}: median "
              f"{rec['time_s'] * 1e6:.1f} us", file=sys.stderr)
    doc = {"source": "measured", "experiment": exp.name, "provenance": provenance, "runs": runs, "skipped": skipped}
    _write_measurements(args.out, doc)
    return 0


def cmd_microbench(args) -> int:
    """`hbmsim microbench`: the presets' achievable rates measured on this machine's GPU."""
    from hbmsim.kernels.gpu import gpu_available
    from hbmsim.kernels.microbench import main
    check_output_path(args.out, "--out")
    ok, why = gpu_available()
    if not ok:
        raise HbmsimError(f"microbench: no GPU to measure on ({why}); nothing was measured or written")
    host = ["--host"] if getattr(args, "host", False) else []
    latency = ["--latency"] if getattr(args, "latency", False) else []
    return main(["--out", args.out, "--repeats", str(args.repeats), *host, *latency])


def cmd_profile_library(args) -> int:
    """`hbmsim profile-library`: PyTorch's FlashAttention-2 kernels and the FA2 paper's PyTorch
    baseline over the paper's grid on this machine's GPU, pass by pass (kernels/library.py)."""
    from hbmsim.kernels import library
    check_output_path(args.out, "--out")
    for impl in args.impl:
        if impl not in library.IMPLEMENTATIONS:
            raise HbmsimError(f"profile-library: --impl {impl!r} must be one of {', '.join(library.IMPLEMENTATIONS)}")
    for d in args.head_dim:
        if d not in library.HEAD_DIMS:
            raise HbmsimError(f"profile-library: --head-dim {d} must be one of the paper's "
                              f"{', '.join(map(str, library.HEAD_DIMS))}")
    try:
        import torch
    except ImportError:
        raise HbmsimError("profile-library: PyTorch is not installed; nothing was measured or written") from None
    if not torch.cuda.is_available():
        raise HbmsimError("profile-library: torch sees no CUDA GPU; nothing was measured or written")
    if getattr(args, "decode", False):          # kernels/library_decode.py's grid and implementations
        return library.main(["--decode", "--out", args.out, "--warmup", str(args.warmup), "--repeats",
                             str(args.repeats)])
    argv = ["--out", args.out, "--impl", *args.impl, "--head-dim", *map(str, args.head_dim),
            "--causal", *args.causal, "--max-seq-len", str(args.max_seq_len), "--warmup", str(args.warmup),
            "--repeats", str(args.repeats)]
    return library.main(argv)
