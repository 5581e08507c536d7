"""A bandwidth (or throughput) pool shared fairly by every request in flight: processor sharing.

The fluid model: with n requests in flight on a pool of rate R, each is served at R/n. We keep a
virtual clock V (work served to each request so far, in the pool's unit: bytes or seconds of
work); a request of size s arriving when the clock reads V finishes when the clock reads V + s.
Requests finish in order of that tag, so one heap and one pending wake-up event suffice: O(1)
SimPy events per request, however many requests share the pool.

A fixed latency (DRAM round trip) is added after a request's data has been served; concurrent
requests overlap their latencies, as pipelined memory requests do.
"""
from __future__ import annotations

import heapq

import simpy
from simpy.events import NORMAL

_REL_EPS = 1e-12


class Completion(simpy.Event):
    """An event that a pool fires some time after the request's service ends."""

    __slots__ = ()

    def fire_after(self, delay_s: float) -> None:
        # What simpy.Timeout.__init__ does, for an event created earlier.
        self._ok = True
        self._value = None
        self.env.schedule(self, NORMAL, delay_s)


class SharedPool:
    """Processor-sharing server: `request(amount)` returns an event that fires when served."""

    def __init__(self, env: simpy.Environment, rate_per_s: float, latency_s: float = 0.0, name: str = "pool"):
        self.env = env
        self.rate_per_s = float(rate_per_s)
        self.latency_s = float(latency_s)
        self.name = name
        self._virtual = 0.0          # work served to each in-flight request so far
        self._last_s = 0.0           # when _virtual was last brought up to date
        self._heap: list = []        # (finish tag, seq, event)
        self._seq = 0
        self._wake_at_s = None       # time of the pending wake-up, if any
        self.busy_s = 0.0            # time with at least one request in flight
        self.served = 0.0            # total work served

    def _advance(self, now: float) -> None:
        n = len(self._heap)
        if n:
            dt = now - self._last_s
            self._virtual += dt * self.rate_per_s / n
            self.busy_s += dt
        self._last_s = now

    def request(self, amount: float) -> Completion:
        env = self.env
        ev = Completion(env)
        self.served += amount
        if amount <= 0:
            ev.fire_after(0.0)
            return ev
        self._advance(env.now)
        self._seq += 1
        entry = (self._virtual + amount, self._seq, ev)
        heapq.heappush(self._heap, entry)
        # A newcomer only delays the others; a pending wake-up stays valid unless it finishes first.
        if self._wake_at_s is None or self._heap[0] is entry:
            self._arm()
        return ev

    def _arm(self) -> None:
        """Make sure a wake-up is pending no later than the next finish (early ones re-arm)."""
        if not self._heap:
            return
        now = self.env.now
        at = now + max(self._heap[0][0] - self._virtual, 0.0) * len(self._heap) / self.rate_per_s
        if self._wake_at_s is not None and self._wake_at_s <= at:
            return  # the pending wake-up comes first; it will re-arm
        self._wake_at_s = at
        t = self.env.timeout(at - now)
        t.callbacks.append(self._wake)

    def _wake(self, event) -> None:
        now = self.env.now
        if self._wake_at_s is None or now < self._wake_at_s:
            return  # superseded by an earlier wake-up that already ran
        self._wake_at_s = None
        self._advance(now)
        heap = self._heap
        limit = self._virtual + _REL_EPS * max(1.0, abs(self._virtual))
        while heap and heap[0][0] <= limit:
            heapq.heappop(heap)[2].fire_after(self.latency_s)
        self._arm()


class FifoPipe:
    """A pipe that serves requests one after another in arrival order at a fixed rate.

    Used for an SM's compute pipeline and for L2 hits: the finish time is known when the request
    is issued, so each request costs exactly one SimPy event. Throughput equals a fair-share
    pool's; only the order in which concurrent requests finish differs.
    """

    def __init__(self, env: simpy.Environment, rate_per_s: float, latency_s: float = 0.0, name: str = "pipe"):
        self.env = env
        self.rate_per_s = float(rate_per_s)
        self.latency_s = float(latency_s)
        self.name = name
        self._free_at_s = 0.0
        self.busy_s = 0.0
        self.served = 0.0

    def reserve(self, amount: float) -> float:
        """Queue a request without an event of its own; returns when it will be served."""
        now = self.env.now
        service_s = amount / self.rate_per_s
        start = self._free_at_s if self._free_at_s > now else now
        self._free_at_s = start + service_s
        self.busy_s += service_s
        self.served += amount
        return self._free_at_s + self.latency_s

    def request(self, amount: float) -> Completion:
        done_s = self.reserve(amount)
        ev = Completion(self.env)
        ev.fire_after(done_s - self.env.now)
        return ev
