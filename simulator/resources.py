"""A bandwidth (or throughput) pool shared fairly by every request in flight: processor sharing.

The fluid model: with n requests in flight on a pool of rate R, each is served at R/n. We keep a
virtual clock V (work served to each request so far, in the pool's unit: bytes or seconds of
work); a request of size s arriving when the clock reads V finishes when the clock reads V + s.
Requests finish in order of that tag, so one priority queue and one pending wake-up event
suffice: O(1) SimPy events per request, however many requests share the pool. The queue is a FIFO
per request size (V only grows while requests are in flight, so requests of one size finish in
arrival order) and a heap of the FIFOs' heads: a handful of sizes, where thousands of requests may
be in flight.

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

import math
from collections import deque
from heapq import heappop, heappush, heapreplace

import simpy

from .errors import HbmsimError
from .simpy_adapter import Timer, schedulers, timers

_REL_EPS = 1e-12


def _finite_delay(delay_s: float, name: str, rate_per_s: float, amount: float) -> float:
    if not delay_s < math.inf:
        raise HbmsimError(f"{name} = {rate_per_s!r}: serving {amount!r} would take longer than simulated time can "
                          "count (about 1e308 s): the rate is too small")
    return delay_s


class SharedPool:
    """Processor-sharing server: `request(amount)` returns an event that fires when served."""

    def __init__(self, env: simpy.Environment, rate_per_s: float, latency_s: float = 0.0, name: str = "pool",
                 inline: bool = False):
        self.env = env
        self.rate_per_s = float(rate_per_s)
        self.latency_s = float(latency_s)
        self.name = name
        # inline (latency 0 only): a finished request's callbacks run inside the wake-up that finishes
        # it, once the pool's state is up to date, instead of one more scheduled event each
        self._inline = inline and self.latency_s == 0.0
        self._virtual = 0.0          # work served to each in-flight request so far
        self._last_s = 0.0           # when _virtual was last brought up to date
        self._fifos: dict = {}       # request size -> deque of (finish tag, seq, event), in arrival order
        self._heads: list = []       # heap of (finish tag, seq, deque): the head of each non-empty deque
        self._in_flight = 0          # requests in flight (n)
        self._seq = 0                # requests with work so far (each costs O(1) events): `requests`
        self._wake_at_s = None       # time of the pending wake-up, if any
        self._wake_event = None      # the pending wake-up itself: only it may act
        self.busy_s = 0.0            # time with at least one request in flight
        self.served = 0.0            # total work served
        self.wakes = 0               # wake-ups that acted (for the liveness tests)
        self._after = timers(env)    # schedules a wake-up (an env.timeout, cheaper)
        self._fire_after = schedulers(env)    # schedules a request's completion

    @property
    def requests(self) -> int:
        """Requests with work so far (each costs O(1) SimPy events)."""
        return self._seq

    def outstanding(self) -> float:
        """Work requested and not yet served, now (while requests are in flight the pool serves
        rate_per_s in all, so what it has served is rate_per_s x busy_s): fold.py's queue check."""
        self._advance(self.env._now)
        return self.served - self.rate_per_s * self.busy_s

    def _advance(self, now: float) -> None:
        """Bring the virtual clock up to `now`: each of the n requests in flight got rate/n.
        (request and _wake do the same, written out: they are the simulator's hot path.)"""
        n = self._in_flight
        if n:
            dt = now - self._last_s
            self._virtual += dt * self.rate_per_s / n
            self.busy_s += dt
        self._last_s = now

    def request(self, amount: float) -> Timer:
        env = self.env
        ev = Timer()                 # the completion: scheduled when the pool knows its finish time
        ev.callbacks = []
        self.served += amount
        if amount <= 0:
            self._fire_after(ev, 0.0)
            return ev
        now = env._now               # (SimPy's clock: env.now without the property call)
        n = self._in_flight
        if n:                        # _advance(now)
            dt = now - self._last_s
            tag = self._virtual = self._virtual + dt * self.rate_per_s / n
            self.busy_s += dt
        else:
            tag = self._virtual
        self._last_s = now
        self._in_flight = n + 1
        seq = self._seq = self._seq + 1
        tag += amount                # finishes when the virtual clock reads V + amount
        fifo = self._fifos.get(amount)
        if fifo is None:
            fifo = self._fifos[amount] = deque()
        fifo.append((tag, seq, ev))
        # A newcomer only delays the others; a pending wake-up stays valid unless it finishes first
        # (which it can only as the head of its FIFO: the others there finish before it).
        if len(fifo) == 1:
            head = (tag, seq, fifo)
            heappush(self._heads, head)
            if self._wake_event is None or self._heads[0] is head:
                self._arm(now)
        elif self._wake_event is None:
            self._arm(now)
        return ev

    def _arm(self, now: float) -> None:
        """Make sure a wake-up is pending no later than the next finish (early ones re-arm)."""
        heads = self._heads
        if not heads:
            return
        # The first finisher's remaining work (never below 0: max(remaining, 0.0)), served at rate/n each.
        remaining = heads[0][0] - self._virtual
        if remaining < 0.0:
            remaining = 0.0
        delay_s = remaining * self._in_flight / self.rate_per_s
        if not delay_s < math.inf:
            _finite_delay(delay_s, self.name, self.rate_per_s, heads[0][0] - self._virtual)   # raises
        at = now + delay_s
        if self._wake_event is not None and self._wake_at_s <= at:
            return  # the pending wake-up comes first; it will re-arm
        self._wake_at_s = at
        self._wake_event = self._after(delay_s, self._wake)

    def _wake(self, event) -> None:
        if event is not self._wake_event:
            return  # superseded by an earlier wake-up
        self._wake_event = self._wake_at_s = None
        self.wakes += 1
        now = self.env._now
        heads, rate = self._heads, self.rate_per_s
        n = self._in_flight
        if n:                        # _advance(now)
            dt = now - self._last_s
            self._virtual += dt * rate / n
            self.busy_s += dt
        self._last_s = now
        v, latency_s, fire_after = self._virtual, self.latency_s, self._fire_after
        limit = v + _REL_EPS * v         # (v >= 0: it only grows from 0)
        finished = [] if self._inline else None
        while heads:
            tag, _, fifo = heads[0]
            # Finished: served up to rounding, or so nearly that its finish time is `now` itself.
            if tag > limit and now + (tag - v) * n / rate > now:
                break
            if finished is None:
                fire_after(fifo.popleft()[2], latency_s)
            else:
                finished.append(fifo.popleft()[2])
            n -= 1
            if fifo:                 # its FIFO's next request heads it now
                heapreplace(heads, (fifo[0][0], fifo[0][1], fifo))
            else:
                heappop(heads)
        self._in_flight = n
        if not n:
            self._virtual = 0.0      # idle: restart the virtual clock (keeps its rounding small)
            self._fifos.clear()      # (and forget the sizes seen)
        self._arm(now)
        if finished:                 # inline: processed now, as env.step would (callbacks may request more)
            for ev in finished:
                callbacks, ev.callbacks = ev.callbacks, None
                for callback in callbacks:
                    callback(ev)


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

    def reserve(self, amount: float, not_before_s: float = 0.0) -> float:
        """Queue a request without an event of its own; returns when it will be served. It starts
        when the pipe is free, now, or at `not_before_s` (what it depends on), whichever is last."""
        now = self.env._now
        if not_before_s > now:
            now = not_before_s
        service_s = amount / self.rate_per_s
        free_at_s = self._free_at_s
        free_at_s = (free_at_s if free_at_s > now else now) + service_s     # starts when free, or now
        if not free_at_s < math.inf:
            _finite_delay(free_at_s, self.name, self.rate_per_s, amount)     # raises
        self._free_at_s = free_at_s
        self.busy_s += service_s
        self.served += amount
        return free_at_s + self.latency_s
