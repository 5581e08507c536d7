"""The registry of attention programs: everything outside algorithms/ reaches a program here.

Each program module exports one `AlgorithmSpec`: its name and label, a frozen mapping dataclass
(block sizes or GEMM tiles, with defaults, and "auto" where the program has a rule), how to
resolve a mapping for a GPU (auto rule, clamping, SRAM fit of every pass it runs), how to build
its simulated program, its closed-form traffic per pass, and what the real kernels offer for it.
Adding a program is its module, its formulas and its tests: `register(spec)` makes the
experiment loader, runner, report, compare, measure and anomalies see it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from hbmsim.simulator import GPU, HbmsimError, Program

from .common import refuse_paged
from .workload import AttentionData, Workload

PASSES = ("forward", "backward")
AUTO = "auto"


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str                       # what experiments write: algorithm = "flash2"
    label: str                      # for people: "FlashAttention-2 (Dao 2023)"
    mapping_type: type              # frozen dataclass of the mapping fields, with their defaults
    # (workload, mapping with every field resolved, data or None, training) -> Program
    build: Callable[[Workload, object, AttentionData | None, bool], Program]
    # (workload, resolved mapping, "forward" | "backward") -> {tensor: (read bytes, write bytes)}
    io: Callable[[Workload, object, str], dict]
    # (workload, resolved mapping, training) -> SRAM bytes one block of its largest kernel needs
    sram_bytes: Callable[[Workload, object, bool], int]
    # (gpu, workload, mapping as given, training) -> (resolved mapping, notes about what changed)
    resolve: Callable[[GPU, Workload, object, bool], tuple] | None = None
    # (workload, resolved mapping, training) -> tile steps, for the "this will take ..." estimate
    # (with coarsens, also a fast=True keyword: the steps fast mode simulates)
    steps: Callable[[Workload, object, bool], int] | None = None
    describe: Callable[[object], str] = lambda m: "x".join(str(v) for v in dataclasses.astuple(m))
    passes: tuple = PASSES
    auto_fields: tuple = ()         # mapping fields that may be "auto"
    variants: tuple = ()            # named organisations (the mapping's `variant` field), default first
    bool_fields: tuple = ()         # mapping fields that are true, false or "auto"
    match_fields: tuple = ()        # mapping fields that identify a real kernel's run (compare)
    # N x N float64 arrays its numerics hold beyond the reference's: (forward, more when training)
    nn_arrays: tuple = (0, 0)
    kernel: str | None = None       # the real kernel that implements its forward (kernels/)
    # (variant, kernel) pairs: variants that model another of the project's kernels than `kernel`
    # (flash2's "rawkernel-tc": the tensor-core kernel flash_attention_tc)
    variant_kernels: tuple = ()
    no_kernel_reason: str = "no real kernel implements it"
    emulated: bool = False          # the CPU emulation can count that kernel's bytes
    # build takes fast=True (runner: fast mode): inner loops over many tiles run several a step
    coarsens: bool = False
    no_emulation_reason: str = "the CPU emulation runs only the flash kernel"
    # it models a paged KV cache (workload kv_page_size); the others refuse one in `resolved`
    paged_kv: bool = False
    # it needs Hopper's TMA and wgmma (GPU has_wgmma = 1; flash3): refused elsewhere in `resolved`,
    # and left out of the listings that run every program on any GPU (algorithms(), unless asked)
    needs_wgmma: bool = False
    # (workload, L2 bytes of the whole GPU, slice factor k) -> whether fast mode may run it on a
    # 1/k slice of the GPU (scenarios/runner.py: slice_factor): its batch-heads alike, and what
    # they share (a causal mask) reused through the L2 alike in the slice and the whole (None: never)
    slices: Callable[[Workload, int, int], bool] | None = None

    def kernel_of(self, mapping) -> str | None:
        """The real kernel that runs what `mapping` (its variant) describes, or None."""
        return dict(self.variant_kernels).get(getattr(mapping, "variant", None), self.kernel)

    def variant_modelling(self, kernel: str) -> str | None:
        """The variant that models exactly what `kernel` issues (a measured run of it says so), or None."""
        return next((v for v, k in self.variant_kernels if k == kernel), None)

    @property
    def mapping_fields(self) -> tuple:
        return tuple(f.name for f in dataclasses.fields(self.mapping_type))

    def mapping_from(self, params: dict, where: str):
        """The mapping dataclass from a run table's fields, each checked: a whole number >= 1
        (or "auto" where the program has a rule)."""
        values = {}
        for key in self.mapping_fields:
            if key not in params:
                continue
            v = params[key]
            if key == "variant":
                if v not in self.variants:
                    raise HbmsimError(f"{where}: field 'variant' = {v!r} must be one of {', '.join(self.variants)}")
                values[key] = v
                continue
            if key in self.bool_fields:
                if not isinstance(v, bool) and v != AUTO:
                    raise HbmsimError(f"{where}: field '{key}' = {v!r} must be true, false or \"auto\"")
                values[key] = v
                continue
            if key in self.auto_fields and v == AUTO:
                values[key] = v
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                limit = 'a whole number >= 1 or "auto"' if key in self.auto_fields else "a whole number >= 1"
                raise HbmsimError(f"{where}: field '{key}' = {v!r} must be {limit}")
            values[key] = v
        return self.mapping_type(**values)

    def uniform(self, size: int, **fields):
        """The default mapping with every block and tile (fields named block_* or tile_*) `size`
        wide, and `fields` as given: e.g. the worked examples' blocks of 2."""
        sizes = {f: size for f in self.mapping_fields if f.startswith(("block_", "tile_"))}
        return self.mapping_type(**{**sizes, **fields})

    def rectangular(self, rows: int, cols: int, **fields):
        """The default mapping with the query side's blocks and tiles (fields named block_q* or
        tile_m) `rows` tall, the key side's (block_kv*, tile_n) `cols` wide, any other block or
        tile (a GEMM's k-step, tile_k) half of `cols` and at least 1, and `fields` as given: the
        property tests' sweep over every registered program."""
        def size(f):
            return rows if f.startswith(("block_q", "tile_m")) else cols if f.startswith(("block_kv", "tile_n")) \
                else max(1, cols // 2)
        sizes = {f: size(f) for f in self.mapping_fields if f.startswith(("block_", "tile_"))}
        return self.mapping_type(**{**sizes, **fields})

    def resolved(self, gpu: GPU, wl: Workload, mapping, training: bool) -> tuple:
        """(mapping with every field a number, notes). A paged workload for a program that
        does not model one: one line (HbmsimError)."""
        if not self.paged_kv and getattr(wl, "kv_page_size", None) is not None:
            refuse_paged(wl, self.name)
        if self.needs_wgmma and not getattr(gpu, "has_wgmma", 0):
            raise HbmsimError(f"{self.name}: hardware '{gpu.name}' has has_wgmma = 0: {self.label} needs Hopper's "
                              "TMA and wgmma (compute capability 9.0); use h100-sxm5-80gb or h200-sxm-141gb")
        if self.resolve is None:
            return mapping, ()
        return self.resolve(gpu, wl, mapping, training)


_REGISTRY: dict[str, AlgorithmSpec] = {}


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"algorithm {spec.name!r} is registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def get(name: str, where: str = "") -> AlgorithmSpec:
    spec = _REGISTRY.get(name) if isinstance(name, str) else None
    if spec is None:
        raise HbmsimError(f"{where + ': ' if where else ''}field 'algorithm' = {name!r} must be one of "
                          f"{', '.join(_REGISTRY)}")
    return spec


def algorithms(hopper: bool = False) -> list[AlgorithmSpec]:
    """Every registered program that runs on any GPU, in registration order; with `hopper`, also
    those that need Hopper's TMA and wgmma (needs_wgmma: flash3)."""
    return [s for s in _REGISTRY.values() if hopper or not s.needs_wgmma]


def algorithm_variants(hopper: bool = False) -> list[tuple[AlgorithmSpec, str | None]]:
    """Every registered program with each of its named variants (None where it has none), in
    registration order, default variant first: what the tests run (`hopper`: as in algorithms)."""
    return [(spec, v) for spec in algorithms(hopper) for v in (spec.variants or (None,))]


def mapping_fields() -> tuple:
    """Every mapping field of every program (what a run table or a sweep may name)."""
    out: list = []
    for spec in _REGISTRY.values():
        out += [f for f in spec.mapping_fields if f not in out]
    return tuple(out)
