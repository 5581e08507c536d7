"""The program API: what a simulated program is made of and what its blocks can do.

A Program is a list of kernel Launches run in order. A Launch has a grid of thread blocks, the
SRAM one block needs, and a block function: a generator run once per block against a
BlockContext, whose calls (`load`, `load_tiles`, `prefetch`/`wait`, `store`, `store_tiles`,
`atomic_add`, `compute`, `compute_chain`, `fork`, `event`, `steady_loop`, `note`) move tiles and
use the SM.
Every byte a result reports was counted by those calls.

This module is the interface a program's author sees, and knows nothing of the engine: the
engine (machine.py) runs programs, and its context (context.py) is what a block's calls reach.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Protocol

from .tensor import TensorView


@dataclass(frozen=True)
class Launch:
    """One kernel launch. `block(ctx, index)` is a generator function run once per block."""
    name: str
    grid: int
    sram_bytes: int
    block: Callable
    allocs: tuple = ()      # tensors that come to exist in HBM when this launch starts
    frees: tuple = ()       # tensors released after it ends
    pass_name: str = "forward"   # which pass of a training step the kernel belongs to
    # what drives its tensor cores (time_model.py): "library" (cuBLAS: the GPU's best instruction)
    # or "mma.sync" (the warp-level instruction FlashAttention 1 and 2 are written with)
    tensor_op: str = "library"
    # what its vector work counts (time_model.py): "fp32", operations at the FP32 lanes' rate, or
    # "instructions", a measured instruction count x 32 lanes (PyTorch's elementwise, copy and softmax
    # kernels, from Nsight Compute), issued at the warp schedulers' rate
    vector_work: str = "fp32"
    # the warp instructions a compute call of its blocks issues, every kind (mma, ldmatrix, softmax,
    # address arithmetic), as (per GEMM FLOP, per shared-memory byte read, per vector operation): a
    # kernel trait (the instruction shapes and Nsight Compute's smsp__inst_executed) for the warp_issue
    # effect (time_model.py); (): not known
    warp_instructions: tuple = ()
    # blocks b and b + period do the same work (the same tile shapes loaded and stored, the same
    # compute), only on another batch-head: what lets the machine fold a steady launch (fold.py);
    # 0: not declared, never folded
    period: int = 0
    # the compiled kernel's threads per block and registers per thread (ptxas, or Nsight Compute's
    # launch__registers_per_thread): with the `registers` effect they cap the blocks an SM holds;
    # 0: not known, only shared memory and max_blocks_per_sm limit them
    threads_per_block: int = 0
    registers_per_thread: int = 0
    # the framework ops (eager PyTorch ops, or autograd nodes in a backward) the host dispatches
    # before this launch, the op that launches it included (host.py): 1 for a kernel an op of its
    # own launches; 0 for a kernel the same op launched after the previous one
    host_ops: int = 1
    # its blocks build what every batch-head shares (the causal mask a framework materialises once):
    # a fast-mode slice with 1/k of the batch-heads runs 1/k of them (slice_shared)
    shared: bool = False


@dataclass
class Program:
    name: str
    launches: list
    inputs: tuple = ()                              # tensors in HBM before the first launch
    outputs: dict = field(default_factory=dict)     # name -> Tensor, returned as numpy


class BlockContext(Protocol):
    """What a block sees: load, store, compute. Every call is used as `yield from ctx.load(...)`:
    the loads and `wait` are SimPy generators; store, atomic_add and compute do their work when
    called and return the events to wait for (none, or one). A tile is a view of a tensor's
    batch-head (`tensor[g]`) with a row and a column slice; the machine checks its bounds."""

    sm: int          # the SM the block runs on
    block: int       # the block's index in its launch's grid

    def load(self, view: TensorView, rows: slice, cols: slice, access=None):
        """Move one tile from global memory into SRAM; returns it (None in count-only mode).
        `access`: how the kernel's threads read it (tensor.py: COALESCED, Strided, PER_THREAD_ROW),
        counted in the 32-byte sectors it touches; None: the tile's own bytes; tensor.L2Lines(r):
        its own bytes, which the L2 keeps as lines of r rows (tiles taken together in a step)."""

    def load_tiles(self, *tiles):
        """Issue several tile loads at once (in flight together, as cp.async does) and wait
        for all of them. Each tile is (view, rows, cols) or (view, rows, cols, access); returns
        the list of tiles."""

    def prefetch(self, *tiles):
        """Start loading tiles without waiting (cp.async): returns a handle for `wait`. The
        block can compute meanwhile; the tiles' SRAM must be free, which the program ensures."""

    def wait(self, handle):
        """Wait for a prefetch to land (cp.async.wait_group); returns its tiles."""

    def store(self, view: TensorView, rows: slice, cols: slice, value=None, access=None) -> tuple:
        """Write one tile back to global memory (value is ignored in count-only mode); `access`
        as for `load`."""

    def store_tiles(self, *tiles) -> tuple:
        """Issue several tile stores at once; each is (view, rows, cols, value[, access]). Like a GPU's
        stores they do not stall the block: they use bandwidth, and the kernel ends only when
        all of them have drained. (Nothing to wait for: returns no events.)"""

    def atomic_add(self, view: TensorView, rows: slice, cols: slice, value=None, access=None) -> tuple:
        """value is added to the tile in global memory, atomically (as atomicAdd / RED do, at L2):
        counted as a read and a write of the tile; like a store, it does not stall the block.
        `access` as for `load`."""

    def compute(self, matmul_flops: int = 0, vector_flops: int = 0, sram_bytes: int = 0, exp_ops: int = 0) -> tuple:
        """Occupy this SM's tensor cores, vector units (of which `exp_ops` are exps, for the
        special-function unit) and SRAM reads, for as long as the time model (time_model.py) says.
        Returns the event to wait for (none when the SM is done already)."""

    def compute_chain(self, *phases: dict) -> tuple:
        """Several compute calls that depend on each other (each a dict of `compute`'s arguments),
        run back to back on this SM: the same time as calling `compute` for each, in one event."""

    def fork(self, role, name: str | None = None):
        """Run the generator `role` (a warp role of this block: a producer warp, a consumer
        warpgroup, called `name` on the timeline) concurrently with the caller, on this block's SM
        with this context's calls. Returns an event that fires when it ends (`yield` it to join)."""

    def event(self):
        """A fresh event for roles to meet at (a barrier, a buffer-full or buffer-empty flag):
        `yield` it to wait, `.succeed()` it to release the waiters."""

    def barrier(self, parties: int):
        """A named barrier of `parties` warp roles of this block (bar.sync over their threads), used
        step after step: each role's `yield from b.sync()` returns once all `parties` have reached it
        (the named_barriers effect; off, a role passes it without waiting)."""

    def steady_loop(self, first: int, last: int):
        """A handle on this block's loop of alike iterations `first`..`last`: `j =
        loop.next(j)` at the top of iteration j returns the iteration to run, j or (fast mode, a
        launch of one wave, every block steady) a later one, the skipped ones counted and their time
        added to the kernel's, not simulated (simulator/loop_fold.py)."""

    def note(self, what: str, **values) -> None:
        """An annotation of the program's own numbers (a tile's S, m, l, O...), for `hbmsim explain`:
        passed to the machine's listener, and nothing at all when nobody listens."""


def slice_shared(program: Program, k: int) -> Program | None:
    """`program`, built for 1/k of the batch-heads on 1/k of the GPU (a fast-mode slice,
    scenarios/runner.py), with each shared launch running one in k of its blocks (blocks 0, k, 2k,
    ...): on a k-th of the SMs and DRAM the launch then takes its whole-GPU time, and k times its
    counts are the whole launch's. None when a shared launch's grid is not a multiple of k (its
    blocks would not split evenly)."""
    launches = []
    for launch in program.launches:
        if launch.shared:
            if launch.grid % k:
                return None
            launch = replace(launch, grid=launch.grid // k, block=_every_kth(launch.block, k))
        launches.append(launch)
    return replace(program, launches=launches)


def _every_kth(block: Callable, k: int) -> Callable:
    def kth_block(ctx, index):
        return block(ctx, index * k)
    return kth_block
