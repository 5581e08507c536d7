"""Experiments: TOML files naming hardware, a workload, runs (algorithm + mapping) and a sweep.

Hardware, workload and mapping (block sizes) are separate inputs, as in Timeloop. Loading
validates everything and expands the sweep into a flat list of configurations; every error
names the file, the field, the value and the limit.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from hbmsim.algorithms import registry
from hbmsim.algorithms.workload import Workload
from hbmsim.simulator import GPU, HbmsimError, load_gpu

HARDWARE_DIR = Path(__file__).parent / "hardware"
EXPERIMENTS_DIR = Path(__file__).parent / "experiments"

WORKLOAD_FIELDS = ("batch", "heads", "seq_len", "seq_len_q", "seq_len_kv", "head_dim", "dtype",
                   "causal", "key_padding_mask", "dropout", "scale", "kv_heads", "kv_page_size")
CONTIGUOUS = "contiguous"      # kv_page_size's spelling of "not paged"


def run_fields() -> tuple:
    """What a [[runs]] table may set: the algorithm, its passes, and any program's mapping fields."""
    return ("algorithm", "passes") + registry.mapping_fields()
TOP_FIELDS = ("name", "description", "hardware", "hardware_overrides", "workload", "runs", "sweep")


@dataclass(frozen=True)
class RunSpec:
    algorithm: str
    passes: tuple = ("forward",)
    params: dict = field(default_factory=dict, hash=False)   # the mapping fields the run table gave

    @property
    def spec(self) -> registry.AlgorithmSpec:
        return registry.get(self.algorithm)

    @property
    def training(self) -> bool:
        return "backward" in self.passes


# Hardware fields a [sweep] may vary ("what if the SRAM were larger"), and `hardware` itself.
HARDWARE_SWEEP_FIELDS = ("hardware",) + tuple(f.name for f in dataclasses.fields(GPU)
                                               if f.name not in ("name", "source"))


@dataclass(frozen=True)
class Config:
    """One point to simulate: a workload and a run on a GPU. `where` names the file, the run and
    the sweep point (for messages); `point` is the sweep point itself ({field: value}); `mapping`
    is the resolved block sizes or GEMM tiles (set by `runner.prepare`), `notes` what resolving
    them changed (e.g. a block clamped to the sequence)."""
    gpu: GPU
    workload: Workload
    run: RunSpec
    where: str = ""
    point: dict = field(default_factory=dict, compare=False, hash=False)
    mapping: dict | None = field(default=None, compare=False, hash=False)
    notes: tuple = ()
    # the L2's contents when the run starts (simulator: Machine's l2_start): "cold", or "warm"
    # (the inputs resident, as the copy that made them leaves them); a measured run says which
    l2_start: str = "cold"


@dataclass
class Experiment:
    name: str
    path: str
    gpu: GPU
    configs: list


def sweep_size(ref: str | Path) -> int:
    """How many configurations an experiment expands to (sweep points x runs), without expanding
    it: what `hbmsim run` says, and asks --yes for, before starting a large sweep."""
    path, data = _read(ref)
    runs = data.get("runs")
    sweep = data.get("sweep") if isinstance(data.get("sweep"), dict) else {}
    points = math.prod(len(v) if isinstance(v, list) else 1 for v in sweep.values())
    return points * (len(runs) if isinstance(runs, list) else 1)


def preset_names() -> list[str]:
    return sorted(p.stem for p in HARDWARE_DIR.glob("*.toml"))


def resolve_hardware(ref: str, base_dir: Path | None = None) -> GPU:
    """A preset name, or a path to a hardware TOML (relative to the experiment's folder)."""
    if (HARDWARE_DIR / f"{ref}.toml").is_file():
        return load_gpu(HARDWARE_DIR / f"{ref}.toml")
    for candidate in ([base_dir / ref] if base_dir else []) + [Path(ref)]:
        if candidate.is_file():
            return load_gpu(candidate)
    raise HbmsimError(f"hardware '{ref}' is neither a preset ({', '.join(preset_names())}) nor a file")


def resolve_shipped(ref: str, folder: Path, suffix: str, what: str, give: str) -> Path:
    """A file the user names: a path, or the name of one shipped in `folder` (NAME + suffix).
    A shipped name wins over a folder of the same name in the current directory."""
    p = Path(ref)
    if p.is_file():
        return p
    shipped = folder / f"{ref}{suffix}"
    if shipped.is_file():
        return shipped
    if p.is_dir():
        raise HbmsimError(f"{what} '{ref}' is a folder: give {give}")
    raise HbmsimError(f"{what} '{ref}' not found (a file, or one of: "
                      f"{', '.join(sorted(q.stem for q in folder.glob('*' + suffix)))})")


def resolve_experiment(ref: str) -> Path:
    return resolve_shipped(ref, EXPERIMENTS_DIR, ".toml", "experiment",
                           "an experiment TOML file or a shipped experiment's name")


def _read(ref: str | Path) -> tuple[Path, dict]:
    path = resolve_experiment(str(ref))
    try:
        with path.open("rb") as fh:
            return path, tomllib.load(fh)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise HbmsimError(f"{path}: not valid TOML ({err})") from None
    except OSError as err:
        raise HbmsimError(f"{path}: cannot be read ({err.strerror or err})") from None


def _unknown(where: str, table: dict, known: tuple) -> None:
    for key in table:
        if key not in known:
            raise HbmsimError(f"{where}: unknown field '{key}' (known: {', '.join(known)})")


def _table(where: str, data: dict, key: str, required: bool = True) -> dict:
    value = data.get(key)
    if value is None:
        if required:
            raise HbmsimError(f"{where}: missing table [{key}]")
        return {}
    if not isinstance(value, dict):
        raise HbmsimError(f"{where}: '{key}' must be a table, got {value!r}")
    return value


def make_workload(where: str, w: dict) -> Workload:
    """Workload from a [workload] table (after sweep substitution)."""
    _unknown(f"{where} [workload]", w, WORKLOAD_FIELDS)
    for key in ("batch", "heads", "head_dim"):
        if key not in w:
            raise HbmsimError(f"{where} [workload]: missing field '{key}'")
    if "seq_len" in w:
        v = w["seq_len"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise HbmsimError(f"{where}: workload: field 'seq_len' = {v!r} must be a whole number >= 1")
        if "seq_len_q" in w or "seq_len_kv" in w:
            raise HbmsimError(f"{where} [workload]: give either 'seq_len' or 'seq_len_q' and 'seq_len_kv', not both")
        nq = nk = w["seq_len"]
    elif "seq_len_q" in w and "seq_len_kv" in w:
        nq, nk = w["seq_len_q"], w["seq_len_kv"]
    else:
        raise HbmsimError(f"{where} [workload]: missing field 'seq_len' (or both 'seq_len_q' and 'seq_len_kv')")
    # kv_page_size = "contiguous" is the same as leaving it out (TOML has no null): what lets a
    # [sweep] compare a contiguous and a paged KV cache, kv_page_size = ["contiguous", 256]
    page = w.get("kv_page_size")
    page = None if page == CONTIGUOUS else page
    try:
        return Workload(batch=w["batch"], heads=w["heads"], seq_len_q=nq, seq_len_kv=nk, head_dim=w["head_dim"],
                        dtype=w.get("dtype", "fp16"), causal=w.get("causal", False),
                        key_padding_mask=w.get("key_padding_mask", False), dropout=w.get("dropout", 0.0),
                        scale=w.get("scale"), kv_heads=w.get("kv_heads"), kv_page_size=page)
    except HbmsimError as err:
        raise HbmsimError(f"{where}: {err}") from None


def make_run(where: str, r: dict) -> RunSpec:
    _unknown(where, r, run_fields())
    alg = r.get("algorithm")
    names = ", ".join(a.name for a in registry.algorithms(hopper=True))
    if alg is None:
        raise HbmsimError(f"{where}: missing field 'algorithm' (one of {names})")
    spec = registry.get(alg, where)
    passes = r.get("passes", ["forward"])
    if not isinstance(passes, list) or not passes:
        raise HbmsimError(f"{where}: field 'passes' = {passes!r} must be a non-empty list")
    for p in passes:
        if p not in spec.passes:
            raise HbmsimError(f"{where}: field 'passes' has {p!r}; supported: {', '.join(spec.passes)}")
    if len(set(passes)) != len(passes):
        raise HbmsimError(f"{where}: field 'passes' = {passes!r} names a pass twice")
    for key in r:
        if key not in ("algorithm", "passes") and key not in spec.mapping_fields:
            raise HbmsimError(f"{where}: field '{key}' does not apply to algorithm '{alg}'")
    spec.mapping_from(r, where)         # checks each mapping field's value
    return RunSpec(alg, tuple(passes), {k: v for k, v in r.items() if k in spec.mapping_fields})


def load_experiment(ref: str | Path) -> Experiment:
    path, data = _read(ref)
    where = str(path)
    _unknown(where, data, TOP_FIELDS)
    name = data.get("name", path.stem)
    if "hardware" not in data:
        raise HbmsimError(f"{where}: missing field 'hardware' (a preset: {', '.join(preset_names())}, or a file)")
    overrides = _table(where, data, "hardware_overrides", required=False)
    workload = _table(where, data, "workload")
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
        raise HbmsimError(f"{where}: needs at least one [[runs]] table")
    run_tables = [dict(r) for r in runs]
    sweep = _sweep(where, data)
    gpu_for = _hardware_of_points(where, path.parent, overrides)
    configs = []
    keys = list(sweep)
    for combo in itertools.product(*(sweep[k] for k in keys)):
        point = dict(zip(keys, combo))
        label = ", ".join(f"{k}={v}" for k, v in point.items())
        swept = f" (sweep {label})" if label else ""
        gpu = gpu_for(point.get("hardware", data["hardware"]),
                      {k: v for k, v in point.items() if k in HARDWARE_SWEEP_FIELDS and k != "hardware"}, swept)
        wl = make_workload(where + swept, _point_workload(workload, point))
        for i, rt in enumerate(run_tables):
            at = f"{where} [[runs]] #{i + 1}" + swept
            configs.append(Config(gpu, wl, make_run(at, _point_run(rt, point)), where=at, point=point))
    first_gpu = configs[0].gpu
    return Experiment(name=name, path=where, gpu=first_gpu, configs=configs)


def _sweep(where: str, data: dict) -> dict:
    """The [sweep] table, each key a workload, run or hardware field with a non-empty list."""
    sweep = _table(where, data, "sweep", required=False)
    for key, values in sweep.items():
        if key not in WORKLOAD_FIELDS and key not in run_fields() and key not in HARDWARE_SWEEP_FIELDS:
            raise HbmsimError(f"{where} [sweep]: '{key}' names neither a workload, a run nor a hardware field")
        if not isinstance(values, list) or not values:
            raise HbmsimError(f"{where} [sweep]: '{key}' = {values!r} must be a non-empty list")
    return sweep


def _hardware_of_points(where: str, base_dir: Path, overrides: dict):
    """gpu_for(ref, swept hardware fields, " (sweep ...)"): the hardware of one sweep point (the
    preset or file, the overrides, the swept fields), each made once."""
    gpus: dict = {}

    def gpu_for(ref, hw_point: dict, swept: str) -> GPU:
        key = (ref if isinstance(ref, str) else repr(ref), tuple(hw_point.items()))
        if key not in gpus:
            at = where + swept
            if not isinstance(ref, str):
                raise HbmsimError(f"{at}: field 'hardware' = {ref!r} must be a preset name or a path")
            try:
                gpu = resolve_hardware(ref, base_dir)
            except HbmsimError as err:
                raise HbmsimError(f"{at}: {err}") from None
            if overrides:
                gpu = gpu.with_overrides(overrides, f"{where} [hardware_overrides]")   # re-validated
            if hw_point:
                gpu = gpu.with_overrides(hw_point, f"{at} [sweep]")
            gpus[key] = gpu
        return gpus[key]
    return gpu_for


def _point_workload(workload: dict, point: dict) -> dict:
    """The [workload] table with a sweep point's workload fields (a swept seq_len replaces
    seq_len_q and seq_len_kv)."""
    w = dict(workload)
    for k, v in point.items():
        if k in WORKLOAD_FIELDS:
            if k == "seq_len":
                w.pop("seq_len_q", None)
                w.pop("seq_len_kv", None)
            w[k] = v
    return w


def _point_run(run_table: dict, point: dict) -> dict:
    """A [[runs]] table with a sweep point's algorithm and passes, then the mapping fields that
    apply to the run's program."""
    r = dict(run_table)
    r.update({k: v for k, v in point.items() if k in ("algorithm", "passes")})   # first: they decide
    alg = r.get("algorithm")
    own = registry.get(alg).mapping_fields if alg in [a.name for a in registry.algorithms(hopper=True)] else ()
    for k, v in point.items():          # the mapping fields that apply to this run's program
        if k in own:
            r[k] = v
    return r
