"""Steady-state folding: a long launch of alike blocks is simulated in part, and the rest extrapolated.

A launch may declare a `period` p: block b and block b + p do the same work (the same tile
shapes loaded and stored, the same compute), differing only in the batch-head they touch. Such
a launch, once its first wave has settled, repeats itself: each *unit* of U blocks (a whole
number of periods spanning at least one wave of the machine's W block slots) is dispatched
T seconds after the previous one. The machine then

1. simulates units one by one, noting when each unit's first block is dispatched;
2. waits for the L2 to turn over: until the launch has put as many bytes into the L2 (lines
   of read misses and of stores) as it holds, some lines are still the previous launch's and
   few dirty lines of this one have been evicted, so DRAM traffic is still rising;
3. once the last 3j units' three thirds took the same time (within STEADY_REL_TOL; j = 1, 2,
   4, ...: lock-step waves agree at once, uneven blocks need a longer mean), at this unit and
   at the one before (a single agreement can be chance), and DRAM's queue did not grow over
   the window (by more than QUEUE_REL_TOL of the bytes asked of DRAM in it: stores do not
   stall a block, so a launch whose stores outrun DRAM runs fast until its queue slows its
   loads, and a window taken before that is not the steady state), skips K whole units,
   leaving the last unit and the remainder to simulate (the tail, where the machine drains,
   is never extrapolated), and adds K x T to the launch's time, T the window's mean;
4. counts what the skipped blocks would have counted as K times what the last measured unit
   counted. Units are whole periods, so the L2-side bytes and the FLOPs of the skipped blocks
   are exact (they equal the closed forms); their DRAM bytes (K times the window's mean) and
   busy times are extrapolated.

U = lcm(p, W) when the grid holds WHOLE_WAVE_UNITS of those (skipping a whole number of waves
keeps the tail's wave alignment exact); otherwise the smallest multiple of p spanning a wave,
and the tail may be off by less than one wave's time. Each simulated unit's blocks count into a unit record of
their own (a KernelResult), so that one unit's counts can be multiplied; all are merged into
the launch's result at its end. A launch that never settles is simulated whole.
"""
from __future__ import annotations

import math

from .results import KernelResult

WARMUP_UNITS = 1          # the first unit starts from an idle machine: never used to measure
STEADY_REL_TOL = 1e-3     # a window's thirds within 0.1% of each other: the steady state
QUEUE_REL_TOL = 1e-2      # DRAM's queue grew by at most 1% of the window's DRAM bytes
MIN_UNITS = 7             # warm-up + 3 measured + 1 confirming + at least 1 skipped + the tail
WHOLE_WAVE_UNITS = 24     # whole-wave units are preferred when the grid holds this many
# A list to audit the rule (scripts/fold_audit.py): launches then never skip, and each that would
# have appends what it would have done and how far its extrapolation was from what it simulated.
AUDIT = None


def fold_unit_blocks(period: int, workers: int, grid: int) -> int:
    """Blocks per unit (0: the launch cannot fold): a whole number of periods spanning at least
    a wave, preferring lcm(period, workers) (whole waves too) when the grid holds enough of them
    that folding still skips most of it."""
    if period <= 0 or workers <= 0:
        return 0
    whole_waves = math.lcm(period, workers)
    if WHOLE_WAVE_UNITS * whole_waves <= grid:
        return whole_waves
    unit = period * math.ceil(workers / period)
    return unit if MIN_UNITS * unit <= grid else 0


class LaunchFold:
    """The folding state of one launch (see the module docstring)."""

    def __init__(self, kernel: KernelResult, unit_blocks: int, grid: int, l2=None, hbm=None):
        self.kernel = kernel
        self.l2 = l2                 # the machine's L2Cache (None: no L2), to turn over before measuring
        self.hbm = hbm               # the machine's DRAM pool (resources.SharedPool; None: no queue check)
        self._inserted_at_start = 0 if l2 is None else l2.inserted_bytes
        self.unit = unit_blocks
        self.grid = grid
        self.next_start = 0          # first block of the next unit to be dispatched
        self.starts_s: list = []     # dispatch time of each simulated unit's first block
        self.busy: list = []         # (DRAM busy s, [busy s of each SM]) at each unit's start
        self.queue: list = []        # (DRAM bytes asked so far, of which not yet served) at each unit's start
        self.records: list = []      # one KernelResult per simulated unit
        self.skipped_units = 0
        self.skipped_s = 0.0
        # (the last measured unit's record, the records of the window measured, and that window's
        # DRAM busy s and busiest SM's busy s per unit), once units are skipped
        self._measured = None
        self.settled_unit = None     # the first unit dispatched after the warm-up
        self._audit = None           # AUDIT: (unit, window, units it would skip), once the rule fires

    def dispatch(self, block: int, now_s: float, busy) -> int:
        """Called when `block` is the next to dispatch and starts a unit. Returns the block to run:
        `block` itself, or the first block after the skipped units."""
        k = self.kernel
        self.starts_s.append(now_s)
        self.busy.append(busy())
        if self.hbm is not None:
            self.queue.append((self.hbm.served, self.hbm.outstanding()))
        u = len(self.starts_s) - 1
        if self.settled_unit is None and self._l2_filled():
            self.settled_unit = u          # units from here on are measured
        skip = (self.grid - block) // self.unit - 1          # keep the last unit and the remainder
        if self.skipped_units == 0 and self.settled_unit is not None and skip >= 1:
            window = self._steady_window(u)
            steady = window and self._steady_window(u - 1) and self._queue_steady(u, window)
            if steady and AUDIT is not None:       # note the first decision, skip nothing
                self._audit = self._audit or (u, window, skip)
                steady = False
            if steady:
                (hbm0, sms0), (hbm1, sms1) = self.busy[u - window], self.busy[u]
                self._measured = (self.records[-1], self.records[-window:], (hbm1 - hbm0) / window,
                                  max(b - a for a, b in zip(sms0, sms1)) / window)
                self.skipped_units = skip
                self.skipped_s = skip * (self.starts_s[u] - self.starts_s[u - window]) / window
                block += skip * self.unit
        self.records.append(KernelResult(k.name, k.grid, k.sram_bytes_per_block, k.blocks_per_sm, k.pass_name))
        self.next_start = block + self.unit
        return block

    def _steady_window(self, u: int) -> int:
        """The fewest units 3j before unit u (j = 1, 2, 4, ... from the settled unit on) whose
        three thirds took the same time within STEADY_REL_TOL; 0 if none. Lock-step waves settle
        at j = 1; blocks of unequal length (a causal mask) dispatch unevenly, and need a longer mean.
        (Every j = 1, 2, 3, ... was tried: PyTorch's forward at N = 2048 on H100 then folded on a
        chance agreement, 5.6% off the full simulation.)"""
        starts, j = self.starts_s, 1
        while u - 3 * j >= self.settled_unit:
            thirds = [starts[u - i * j] - starts[u - (i + 1) * j] for i in range(3)]
            if min(thirds) > 0 and max(thirds) - min(thirds) <= STEADY_REL_TOL * min(thirds):
                return 3 * j
            j *= 2
        return 0

    def _queue_steady(self, u: int, window: int) -> bool:
        """DRAM's queue of bytes not yet served grew over the window's units by at most
        QUEUE_REL_TOL of the bytes asked of DRAM in them (always, without a DRAM pool)."""
        if not self.queue:
            return True
        (asked0, queued0), (asked1, queued1) = self.queue[u - window], self.queue[u]
        return queued1 - queued0 <= QUEUE_REL_TOL * (asked1 - asked0)

    def _l2_filled(self) -> bool:
        """Past the warm-up unit, and the launch has put as many bytes into the L2 as it holds."""
        if len(self.starts_s) <= WARMUP_UNITS:
            return False
        l2 = self.l2
        return l2 is None or l2.inserted_bytes - self._inserted_at_start >= l2.capacity_bytes

    @property
    def skipped_blocks(self) -> int:
        return self.skipped_units * self.unit

    def merge(self) -> None:
        """At the launch's end (after its busy times are set): every unit's counts into the
        launch's result, and the skipped units' as K times the last measured unit's."""
        k = self.kernel
        if AUDIT is not None:
            self._note_audit()
        for rec in self.records:
            add_counts(k, rec, 1)
        if self._measured is not None:
            rec, window, hbm_busy_s, sm_busy_s = self._measured
            skipped = self.skipped_units
            add_counts(k, rec, skipped, dram=False)
            add_dram_mean(k, window, skipped)
            k.folded_blocks = self.skipped_blocks
            k.folded_s = self.skipped_s
            k.hbm_busy_s += self.skipped_units * hbm_busy_s
            k.compute_busy_s += self.skipped_units * sm_busy_s

    def _note_audit(self) -> None:
        """AUDIT: this launch's units, and (if the rule fired) the time the skip would have added
        against the time those units took here: K x the window's mean against starts[u + K] - starts[u].
        (The tail then starts from another unit's state: the audit does not see that part.)"""
        k, starts = self.kernel, self.starts_s
        entry = dict(kernel=k.name, pass_name=k.pass_name, grid=self.grid, unit_blocks=self.unit,
                     units=len(starts), kernel_s=k.end_s - k.start_s, would_skip_blocks=0, error_s=0.0)
        if self._audit is not None:
            u, window, skip = self._audit
            extrapolated_s = skip * (starts[u] - starts[u - window]) / window
            entry.update(would_skip_blocks=skip * self.unit, error_s=extrapolated_s - (starts[u + skip] - starts[u]))
        AUDIT.append(entry)


def add_dram_mean(k: KernelResult, window: list, times: int) -> None:
    """DRAM bytes of `times` more units (or iterations) like those of `window` (records): the
    window's mean per tensor, extrapolated (the L2's state makes them differ from unit to unit)."""
    for name in {name for r in window for name in r.tensors}:
        mine = k.traffic(name)
        mine.hbm_read += round(times * sum(r.traffic(name).hbm_read for r in window) / len(window))
        mine.hbm_write += round(times * sum(r.traffic(name).hbm_write for r in window) / len(window))


def add_counts(k: KernelResult, rec: KernelResult, times: int, dram: bool = True) -> None:
    # every counter a block increments: FLOPs, exps, SRAM reads, and each tensor's bytes (L2-side,
    # and DRAM unless `dram` is false)
    k.matmul_flops += times * rec.matmul_flops
    k.vector_flops += times * rec.vector_flops
    k.exp_ops += times * rec.exp_ops
    k.sram_read_bytes += times * rec.sram_read_bytes
    for name, t in rec.tensors.items():
        mine = k.traffic(name)
        mine.read += times * t.read
        mine.write += times * t.write
        if dram:
            mine.hbm_read += times * t.hbm_read
            mine.hbm_write += times * t.hbm_write
