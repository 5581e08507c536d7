"""A bandwidth (or throughput) pool shared fairly by every request in flight: processor sharing.

The fluid model: with n requests in flight on a pool of rate R, each is served at R/n. We keep a
virtual clock V (work served to each request so far, in the pool's unit: bytes or seconds of
work); a request of size s arriving when the clock reads V finishes when the clock reads V + s.
Requests finish in order of that tag, so one heap and one pending wake-up event suffice: O(1)
SimPy events per request, however many requests share the pool.

A fixed latency (DRAM round trip) is added after a request's data has been served; concurrent
requests overlap their latencies, as pipelined memory requests do.

Liveness (every request finishes, in a bounded number of events) rests on three rules, because
simulated time is a float and so is V:
- A request whose remaining service time, added to the clock, does not move the clock
  (now + remaining == now: less than one unit in the last place of `now`) is finished now. Without
  this rule a wake-up at `now` that leaves a few 1e-12 bytes unserved re-arms itself at `now`
  forever (the hang of issue 7: a 4-byte load at t = 15 ns on a 3.35 TB/s pool).
- A wake-up is matched to its arming by identity, never by comparing float times, so a wake-up
  cannot be dropped by rounding, and a superseded one costs one ignored event.
- V restarts at 0 whenever the pool empties, so its rounding error stays relative to the work in
  flight, not to all work ever served.
So every wake-up either finishes a request or moves the clock forward, and each request causes at
most two wake-ups of its own plus one superseded one. A rate so small that a finish time is not a
finite float is an error naming the rate, not an infinite or overflowing clock.
"""
from __future__ import annotations

import heapq
import math

import simpy

from .errors import HbmsimError
from .simpy_adapter import Completion

_REL_EPS = 1e-12


def _finite_delay(delay_s: float, name: str, rate_per_s: float, amount: float) -> float:
    if not delay_s < math.inf:
        raise HbmsimError(f"{name} = {rate_per_s!r}: serving {amount!r} would take longer than simulated time can "
                          "count (about 1e308 s): the rate is too small")
    return delay_s


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
        self._wake_event = None      # the pending wake-up itself: only it may act
        self.busy_s = 0.0            # time with at least one request in flight
        self.served = 0.0            # total work served
        self.requests = 0            # requests with work (each costs O(1) events)
        self.wakes = 0               # wake-ups that acted (for the liveness tests)

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
        self.requests += 1
        self._advance(env.now)
        self._seq += 1
        entry = (self._virtual + amount, self._seq, ev)
        heapq.heappush(self._heap, entry)
        # A newcomer only delays the others; a pending wake-up stays valid unless it finishes first.
        if self._wake_event is None or self._heap[0] is entry:
            self._arm()
        return ev

    def _arm(self) -> None:
        """Make sure a wake-up is pending no later than the next finish (early ones re-arm)."""
        heap = self._heap
        if not heap:
            return
        # The head's remaining work, served at rate/n each.
        delay_s = _finite_delay(max(heap[0][0] - self._virtual, 0.0) * len(heap) / self.rate_per_s,
                                self.name, self.rate_per_s, heap[0][0] - self._virtual)
        at = self.env.now + delay_s
        if self._wake_event is not None and self._wake_at_s <= at:
            return  # the pending wake-up comes first; it will re-arm
        self._wake_at_s = at
        t = self.env.timeout(delay_s)
        self._wake_event = t
        t.callbacks.append(self._wake)

    def _wake(self, event) -> None:
        if event is not self._wake_event:
            return  # superseded by an earlier wake-up
        self._wake_event = self._wake_at_s = None
        self.wakes += 1
        now = self.env.now
        self._advance(now)
        heap, v, rate = self._heap, self._virtual, self.rate_per_s
        limit = v + _REL_EPS * abs(v)
        while heap:
            tag = heap[0][0]
            # Finished: served up to rounding, or so nearly that its finish time is `now` itself.
            if tag > limit and now + (tag - v) * len(heap) / rate > now:
                break
            heapq.heappop(heap)[2].fire_after(self.latency_s)
        if not heap:
            self._virtual = 0.0      # idle: restart the virtual clock (keeps its rounding small)
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
        self._free_at_s = _finite_delay(start + service_s, self.name, self.rate_per_s, amount)
        self.busy_s += service_s
        self.served += amount
        return self._free_at_s + self.latency_s
