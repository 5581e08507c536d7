"""Steady loops: a launch whose blocks all run at once, each a long loop of alike iterations, is
simulated until every block's iterations take a steady time; then every block skips a stretch of
its loop at no simulated time, counting what the skipped iterations would have counted and
adding what they would have taken to the kernel's time (fast mode; the FA1 kernel's forward,
whose few long blocks neither fold nor coarsen: flash1_kernel.py).

A block marks each iteration of its loop (`ctx.steady_loop(first, last)`, then `j =
loop.next(j)` at the top of iteration j). From iteration `first` on, each iteration counts into a
record of its own, so that one iteration's counts can be multiplied. A block is steady once its
last HALF_WINDOW iterations took the same mean time as the HALF_WINDOW before them (within
LOOP_REL_TOL; or 16 against 16), at this iteration and the one before. When every block of the launch is, a cut
of T seconds is fixed (S iterations of the median block, S leaving the last iteration and one
more to simulate), and each block, at its next mark, jumps round(T / its own period) iterations:
blocks of a longer loop body skip fewer, so the faster ones drift ahead as they would have. The
jump takes no simulated time, so no block idles while others run (a version in which each block
waited its skip out ran the others faster meanwhile, sharing its SM's pipe: 0.9% fast). The
skipped iterations count S x the last one's L2-side bytes, FLOPs, exps and SRAM reads (exact:
they are alike) and S x the window's mean DRAM bytes (extrapolated); the kernel's time gets,
from the block that would have ended last, the time its skipped iterations took at its period.

Only a launch of a single wave folds this way (every block resident from its slot's start: no
block waits for a slot; the block scheduler's stagger, 0.9 ns a block, offsets the blocks'
phases, which each block's own marks and period absorb); a loop whose iterations are not alike (a causal
mask's shrinking ones) never looks steady, and is simulated whole.
"""
from __future__ import annotations

import statistics

from .fold import add_counts, add_dram_mean
from .results import KernelResult

HALF_WINDOW = 8           # iterations whose mean period is compared with the same number before
LOOP_REL_TOL = 5e-3       # the two means within 0.5%: iteration times jitter by up to 3% one to the next
MAX_WINDOW = 4 * HALF_WINDOW


def steady_window(starts: list) -> int:
    """2w when the last w iterations (the intervals between the last starts) took the same mean
    time as the w before them, within LOOP_REL_TOL, for w = HALF_WINDOW or twice that; 0 otherwise.
    (A single iteration's time jitters by up to 3% with the other blocks' phases: FA1's forward at
    N = 16384 on H100. fold.py's thirds of 1, 2, 4 units agreed by chance there and missed for a
    few blocks at 8: means of 8, or of 16 where 8 still jitter, are steadier.)"""
    for w in (HALF_WINDOW, 2 * HALF_WINDOW):
        if len(starts) < 2 * w + 1:
            return 0
        a, b = starts[-1] - starts[-1 - w], starts[-1 - w] - starts[-1 - 2 * w]
        if min(a, b) > 0 and abs(a - b) <= LOOP_REL_TOL * min(a, b):
            return 2 * w
    return 0


class _Inert:
    """The handle of a loop that cannot fold (not fast mode, or a launch of several waves)."""

    def next(self, j: int) -> int:
        return j


INERT = _Inert()


class LaunchLoops:
    """The loop-folding state of one single-wave launch: where every block's loop is, and the skip."""

    def __init__(self, kernel: KernelResult, busy):
        self.kernel = kernel
        self.busy = busy               # machine._busy: (DRAM busy s, [busy s of each SM])
        self.position: dict = {}       # block -> the iteration it last marked
        self.steady: set = set()       # blocks found steady
        self.periods: dict = {}        # block -> its mean period when found steady
        self.cut_s = 0.0               # the simulated time every block cuts out (S x the median period)
        self.removed: dict = {}        # block -> the time its skipped iterations would have taken
        self.ends: dict = {}           # block -> when it ended (ended())
        self.skip = 0                  # iterations every block skips at its next mark, once decided
        self.skipped_iterations = 0    # summed over blocks, for the result's simulated fraction
        self.iterations = 0            # every block's loop length, summed (the same)
        self.blocks = 0                # blocks with a loop
        self.first_block = None        # the lowest of them: its marks time the busy pools
        self.loops: list = []
        self._busy_at: list = []       # busy at the first block's marks
        self._busy_skipped = None      # (DRAM busy s, busiest SM's busy s) of the skipped iterations

    def loop(self, ctx, first: int, last: int) -> "BlockLoop":
        self.iterations += last + 1
        self.blocks += 1
        self.first_block = ctx.block if self.first_block is None else min(self.first_block, ctx.block)
        loop = BlockLoop(self, ctx, first, last)
        self.loops.append(loop)
        return loop

    def mark_steady(self, block: int, j: int, last: int) -> None:
        """Block `block`, at iteration j, is steady; when every block is, each skips S iterations at
        its next mark, S leaving iteration `last` (and all after it) to simulate."""
        self.steady.add(block)
        if len(self.steady) == self.blocks:
            furthest = max([j] + [p + 1 for b, p in self.position.items() if b != block])
            self.skip = max(0, last - furthest - 1)
            self.cut_s = self.skip * statistics.median(self.periods.values())

    def ended(self, block: int, now_s: float) -> None:
        """Block `block` ended at now_s (machine.py's worker)."""
        self.ends[block] = now_s

    def merge(self) -> None:
        """At the launch's end (after its busy times are set): the skipped iterations' busy time
        (the first block's window, per iteration, times its skip), and the simulated fraction."""
        k = self.kernel
        for loop in self.loops:        # a loop left before its last mark: its open record's counts
            loop._close_record()
            loop._stop()
        if self._busy_skipped is not None:
            k.hbm_busy_s += self._busy_skipped[0]
            k.compute_busy_s += self._busy_skipped[1]
        if self.removed and self.ends:     # the block that would have ended last sets the kernel's end
            k.folded_s += max(0.0, max(t + self.removed.get(b, 0.0) for b, t in self.ends.items())
                              - max(self.ends.values()))
        if self.iterations:
            k.folded_blocks += round(self.blocks * self.skipped_iterations / self.iterations)


class BlockLoop:
    """One block's marks of its loop (see the module docstring)."""

    def __init__(self, launch: LaunchLoops, ctx, first: int, last: int):
        self.launch, self.ctx, self.first, self.last = launch, ctx, first, last
        self.block = ctx.block
        self.starts: list = []         # start time of each marked iteration from `first` on
        self.records: list = []        # their records (the last MAX_WINDOW)
        self.window = 0                # the steady window found
        self.done = False              # skipped, or nothing left to skip: counting as usual

    def next(self, j: int) -> int:
        """Called at the top of iteration j; returns the iteration to run: j, or a later one once
        the launch's cut is fixed (_skip)."""
        if self.done or j < self.first:
            return j
        launch, ctx = self.launch, self.ctx
        launch.position[self.block] = j
        self.starts.append(ctx._m.env.now)
        first_block = self.block == launch.first_block
        if first_block:
            launch._busy_at.append(launch.busy())
        self._close_record()
        if not launch.skip and self.block not in launch.steady and j < self.last:
            window = steady_window(self.starts)
            if window and steady_window(self.starts[:-1]):
                self.window = window
                launch.periods[self.block] = (self.starts[-1] - self.starts[-1 - window]) / window
                launch.mark_steady(self.block, j, self.last)
        if launch.skip and self.records:
            return self._skip(j, first_block)
        if j >= self.last or len(launch.steady) == launch.blocks:
            self._stop()               # past the skippable part, or every block steady with no room
            return j
        rec = KernelResult(launch.kernel.name, launch.kernel.grid, launch.kernel.sram_bytes_per_block,
                           launch.kernel.blocks_per_sm, launch.kernel.pass_name)
        self.records.append(rec)
        del self.records[:-MAX_WINDOW]
        ctx.kernel = rec
        return j

    def _skip(self, j: int, first_block: bool) -> int:
        """Skip from j, at no simulated time: the launch's cut of `launch.cut_s` seconds (S times
        the median block's period) is this block's round(cut / its own period) iterations, so that
        faster blocks drift ahead as they would have. Their time (iterations x this block's period)
        is added to the kernel's at its end, by the block that would have ended last (merge)."""
        launch, starts = self.launch, self.starts
        window = min(self.window or steady_window(starts[:-1]) or 1, len(self.records) - 1, len(starts) - 2)
        period_s = (starts[-2] - starts[-2 - window]) / window       # the window up to the previous mark
        s = min(self.last - j, max(0, round(launch.cut_s / period_s)))
        add_counts(launch.kernel, self.records[-1], s, dram=False)
        add_dram_mean(launch.kernel, self.records[-window:], s)
        launch.skipped_iterations += s
        launch.removed[self.block] = s * period_s
        if first_block:
            (h0, sms0), (h1, sms1) = launch._busy_at[-2 - window], launch._busy_at[-2]
            launch._busy_skipped = (s * (h1 - h0) / window, s * max(b - a for a, b in zip(sms0, sms1)) / window)
        self._stop()
        return j + s

    def _close_record(self) -> None:
        """The iteration that just ended counted into its record: add it to the launch's counts."""
        if self.records and self.ctx.kernel is self.records[-1]:
            add_counts(self.launch.kernel, self.records[-1], 1)

    def _stop(self) -> None:
        self.done = True
        self.ctx.kernel = self.launch.kernel
