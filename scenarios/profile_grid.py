"""`hbmsim profile` over a block grid (kernels/profile_grid.py): every point checked first, then
run workload by workload, on the GPU (CUDA-event time under a stated L2 starting state, Nsight
Compute bytes when ncu is present: one ncu process per workload) or through the CPU emulation
(`--emulate`: bytes only, "emulated"). ONE file is written, and rewritten after each workload, so
that a Ctrl-C or SIGTERM keeps every finished workload (the file then says "complete": false).

Each run is named as `hbmsim run` names a flash2 forward (algorithm, pass, workload, block_q,
block_kv, warps), plus the kernel that ran and, when measured, `l2_start` ("cold" | "warm"):
`hbmsim blockmap --measured FILE` and `hbmsim compare` read it.
"""
from __future__ import annotations

import json
import sys
import time

from hbmsim.simulator import HbmsimError

from .outputs import check_output_path, write_text_atomic

GRID_KIND = "block-grid"       # the file's "kind": what blockmap --measured reads
ALGORITHM = "flash2"           # the program that models the flash kernels (scenarios/blockmap_measured.py)


def grid_of(args):
    from hbmsim.kernels.profile_grid import make_grid
    causal = None if args.causal is None else tuple(c == "true" for c in args.causal)
    return make_grid(args.kernel, args.block_q, args.block_kv, args.warps, args.head_dim, args.seq_len, causal,
                     args.dtype, args.batch, args.heads)


def _workload(spec):
    from hbmsim.algorithms.workload import Workload
    return Workload(spec.batch, spec.heads, spec.seq_len_q, spec.seq_len_kv, spec.head_dim, spec.dtype, spec.causal)


def run_record(spec, source: str) -> dict:
    from .runner import workload_dict
    return {"algorithm": ALGORITHM, "pass": "forward", "source": source, "kernel": spec.kernel,
            "workload": workload_dict(_workload(spec)), "block_q": spec.block_q, "block_kv": spec.block_kv,
            "warps": spec.warps}


def command_line(args) -> list[str]:
    """The command as run, every grid flag spelled out (for the provenance)."""
    cmd = ["hbmsim", "profile", "--kernel", args.kernel]
    for flag, values in (("--block-q", args.block_q), ("--block-kv", args.block_kv), ("--warps", args.warps),
                         ("--head-dim", args.head_dim), ("--seq-len", args.seq_len), ("--causal", args.causal)):
        if values:
            cmd += [flag, ",".join(map(str, values))]
    for flag, value in (("--batch", args.batch), ("--heads", args.heads)):
        if value is not None:
            cmd += [flag, str(value)]
    cmd += ["--dtype", args.dtype, "--seed", str(args.seed), "--out", args.out]
    if args.emulate:
        return cmd + ["--emulate"]
    cmd += ["--l2", args.l2, "--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    return cmd + (["--no-ncu"] if args.no_ncu else [])


class Progress:
    """A bar of points on a terminal, a line per point in a log, nothing with --quiet."""

    def __init__(self, n: int, quiet: bool):
        from .progress import wanted
        self.n, self.i, self.quiet = n, 0, quiet
        self.bar = None
        if wanted(quiet):
            from tqdm import tqdm
            self.bar = tqdm(total=n, unit="point", desc="profile grid", file=sys.stderr)

    def point(self, label: str, what: str) -> None:
        self.i += 1
        if self.bar is not None:
            self.bar.update(1)
        elif not self.quiet:
            print(f"[{self.i}/{self.n}] {label}: {what}", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def plan(args) -> tuple:
    """(grid, points, emulate or None, empty file doc): everything checked before anything runs
    (the kernel and its warps, every point's configuration and shared memory, a GPU to measure
    on), so that a bad grid is one line and exit 2 with nothing written."""
    from hbmsim.kernels import profile_grid as G

    check_output_path(args.out, "--out")
    grid = grid_of(args)                                   # kernel, warps: said before anything else
    emulate = None
    if args.emulate:
        from hbmsim.kernels.emulation import MAX_SMEM_BYTES
        emulate = G.emulation_of(grid.kernel)
        points, left_out = G.check_grid(grid, MAX_SMEM_BYTES, "the emulation's limit (H100's opt-in maximum)")
    else:
        from hbmsim.kernels.gpu import gpu_available, smem_limit_bytes
        G.check_grid(grid, 1 << 62, "")                    # the configurations, before asking for a GPU
        ok, why = gpu_available()
        if not ok:
            raise HbmsimError(f"profile: no GPU to measure on ({why}); nothing was measured or written "
                              "(--emulate counts the grid's bytes on the CPU)")
        points, left_out = G.check_grid(grid, smem_limit_bytes(),
                                        "this GPU's limit (max opt-in shared memory per block)")
    doc = {"source": "emulated" if args.emulate else "measured", "kind": GRID_KIND, "grid": grid.describe(),
           "provenance": None, "complete": False, "runs": [],
           "skipped": [{**run_record(s, ""), "reason": why} for s, why in left_out]}
    if left_out and not args.quiet:
        print(f"profile: {len(points)} point(s); {len(left_out)} block_q x warps pairing(s) the kernel does not have "
              "left out (listed under 'skipped')", file=sys.stderr)
    return grid, points, emulate, doc


def run(args, grid, points, emulate, doc, progress) -> None:
    """Run every point into doc["runs"] (the file rewritten after each workload); on return the
    file is complete. A KeyboardInterrupt leaves doc with the finished workloads."""
    if emulate is not None:
        _emulate_grid(args, grid, points, emulate, doc, progress)
    else:
        _measure_grid(args, grid, points, doc, progress)
    doc["complete"] = True
    _write(args.out, doc)


def keep_partial(args, doc, n_points: int) -> str:
    """After an interrupt: the finished points written (complete: false); what was kept, in words."""
    if not doc["runs"]:
        return "nothing was written"
    doc["stopped"] = f"interrupted after {len(doc['runs'])} of {n_points} point(s)"
    _write(args.out, doc)
    return f"kept {len(doc['runs'])} finished point(s) in {args.out}"


def _write(path: str, doc: dict) -> None:
    write_text_atomic(path, json.dumps(doc, indent=1) + "\n")


def _host_inputs(spec, seed: int):
    from .measure import _inputs
    return _inputs(_workload(spec), seed)


def _emulate_grid(args, grid, points, emulate, doc, progress) -> None:
    """Every point through the CPU emulation; the file rewritten after each workload."""
    from hbmsim.kernels.emulation import compiler
    from hbmsim.kernels.profile import emulation_provenance, traffic_fields
    from hbmsim.kernels.profile_grid import emulation_configs, point_label
    from .measure import _max_error

    configs = emulation_configs(points)
    from hbmsim.kernels.profile_grid import emulation_what
    what = emulation_what(grid.kernel)
    doc["provenance"] = {**emulation_provenance(command_line(args), compiler()), **({"what": what} if what else {}),
                         "l2": {"l2_start": None, "how": "the emulation has no L2: its bytes are the kernel's "
                                                         "global loads and stores, the L2-side requests"}}
    chosen = set(points)
    for wl_key in grid.workloads():
        specs = [s for s in grid.specs(*wl_key) if s in chosen]
        (q, k, v), exact = _host_inputs(specs[0], args.seed)
        finished = []
        for spec in specs:
            o, traffic, smem = emulate(spec, q, k, v, configs)
            rec = run_record(spec, "emulated")
            rec.update(traffic_fields(traffic), smem_bytes_per_block=smem,
                       max_abs_error=_max_error(_workload(spec), exact, o))
            finished.append(rec)
            progress.point(point_label(spec), f"read {rec['global_read_bytes']:,} B, write "
                                              f"{rec['global_write_bytes']:,} B")
        doc["runs"] += finished
        _write(args.out, doc)


def _measure_grid(args, grid, points, doc, progress) -> None:
    """Every point on the GPU: CUDA-event time under --l2, then (ncu present) one ncu process per
    workload for the bytes; the file rewritten after each workload."""
    import shutil
    from hbmsim.kernels.gpu import cupy_module
    from hbmsim.kernels.profile import gpu_provenance, measure_on_gpu, ncu_fields, ncu_measure_many
    from hbmsim.kernels.profile_grid import point_label
    from .measure import _max_error

    ncu = None if args.no_ncu else shutil.which("ncu")
    if ncu is None:
        print("ncu not on the PATH (or --no-ncu): recording CUDA-event times only, no DRAM/L2 bytes", file=sys.stderr)
    doc["provenance"] = gpu_provenance(command_line(args), args.warmup, args.repeats, ncu, l2_start=args.l2)
    cp = cupy_module()
    chosen = set(points)
    for wl_key in grid.workloads():
        specs = [s for s in grid.specs(*wl_key) if s in chosen]
        (q, k, v), exact = _host_inputs(specs[0], args.seed)
        device = tuple(cp.asarray(x) for x in (q, k, v))
        finished, ran = [], []
        for spec in specs:
            t0 = time.perf_counter()
            try:
                m = measure_on_gpu(spec, q, k, v, warmup=args.warmup, repeats=args.repeats, l2_start=args.l2,
                                   device_inputs=device)
            except HbmsimError as err:          # a launch the GPU refuses: kept as skipped, the others go on
                doc["skipped"].append({**run_record(spec, ""), "reason": str(err)})
                progress.point(point_label(spec), f"skipped: {err}")
                continue
            rec = {**run_record(spec, "measured"), "hardware": doc["provenance"]["gpu"]}
            rec["max_abs_error"] = _max_error(_workload(spec), exact, m.pop("o"))
            rec.update(m)
            finished.append(rec)
            ran.append(spec)
            progress.point(point_label(spec), f"median {rec['time_s'] * 1e6:.1f} us "
                                              f"({time.perf_counter() - t0:.1f} s)")
        if ncu and ran:
            for rec, kernels in zip(finished, ncu_measure_many(ran, q, k, v, ncu, args.l2)):
                rec.update(ncu_fields(kernels))
        del device
        doc["runs"] += finished
        _write(args.out, doc)
