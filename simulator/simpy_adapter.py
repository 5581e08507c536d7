"""The only place hbmsim touches SimPy's internals (pinned to simpy 4 in pyproject.toml), but
for one read: the hot paths (resources.py, program.py) read the clock as `env._now`, the
attribute behind SimPy's `env.now` property, without the property's Python call.

- `Timer`: what SimPy needs of an event that succeeds with no value and nothing more (its
  callbacks), a fraction of the cost of a simpy.Event.
- `timers(env)`: a function `after(delay_s, callback=None)` that schedules a new `Timer`, the same
  event as `env.timeout(delay_s)` (same time, priority and event number, so the same order
  among other events) at a fraction of its cost: the simulator makes one per compute step and
  per wake-up of a pool.
- `schedulers(env)`: a function `fire_after(event, delay_s)` that schedules a Timer made earlier
  (a pool's completion: made when the request is issued, scheduled when the pool knows its
  finish time), as simpy.Timeout's constructor would for an existing event.
- `Inline(env, generators)`: runs generators (a slot's blocks) as a process would, with the
  events they wait for calling them back directly instead of through a Process step.
- `flags(env)`: a function `flag()` that makes a `Flag`, an event roles meet at (a barrier, a
  buffer-full flag): `flag.succeed()` schedules it as `simpy.Event.succeed` would (now, normal
  priority, the next event number), without simpy.Event's construction and checks.
- `Role(env, generator)`: a SimPy process for a block's warp role (context.fork), with the same
  events as `env.process(generator)` (its start scheduled urgent, as Process's Initialize; its end
  scheduled as an event whose callbacks resume the waiters), so the same order among all events,
  at a fraction of Process's cost.
- `run(env)`: `env.run()` (no `until`), its `step` written into one loop.
- `events_scheduled(env)`: how many events an environment has scheduled (SimPy numbers them).
"""
from __future__ import annotations

from heapq import heappop, heappush

import simpy
from simpy.events import NORMAL, URGENT


class Timer:
    """What SimPy needs of a succeeded event and nothing more: its callbacks (the processes that
    wait on it, or a pool's wake-up). A process may yield it as it yields any event: SimPy reads
    `callbacks` (None once processed), `_ok` and `_value`. Made and scheduled by `timers`, or
    made by a pool (`callbacks` set to []) and scheduled by `schedulers` when it knows when."""

    __slots__ = ("callbacks",)
    _ok = True         # SimPy reads these when it processes the event: it succeeded,
    _value = None      # and a process waiting on it receives None


def timers(env: simpy.Environment):
    """`after(delay_s, callback=None)`: a new Timer that fires `delay_s` (>= 0) from now, as
    `env.timeout(delay_s)` would, calling `callback(timer)` then if given."""
    queue, eids = env._queue, env._eid

    def after(delay_s: float, callback=None) -> Timer:
        ev = Timer()
        ev.callbacks = [] if callback is None else [callback]
        heappush(queue, (env._now + delay_s, NORMAL, next(eids), ev))    # what env.schedule does
        return ev

    return after


def schedulers(env: simpy.Environment):
    """`fire_after(event, delay_s)`: schedule `event` (a Timer not yet scheduled) `delay_s` (>= 0)
    from now, as env.schedule would."""
    queue, eids = env._queue, env._eid

    def fire_after(event: Timer, delay_s: float) -> None:
        heappush(queue, (env._now + delay_s, NORMAL, next(eids), event))

    return fire_after


class Inline(simpy.Event):
    """Runs generators one after another as a SimPy process running `for g in generators:
    yield from g` would, resuming each when the event it yields is processed, but without a
    Process: the events call it back directly, which saves a process step and a generator
    layer on every event. Itself an event that is never scheduled (it costs no SimPy event):
    it is processed at once, inside the step where the last generator returns, so a process
    that yields it resumes at that moment. `generators` is iterated lazily: the code that makes
    the next generator runs when the previous one has returned.
    An exception in a generator propagates out of env.step (from a process it would be raised
    when the failed process is processed). (Its one reference cycle, to its bound callback, is
    broken when the last generator returns: a run's objects are freed by reference counting,
    with the garbage collector off.)"""

    def __init__(self, env: simpy.Environment, generators):
        super().__init__(env)
        self._generators = iter(generators)
        self._generator = None
        self._callback = self._resume        # bound once: it is appended to every event waited for
        self._resume(_STARTED)

    def _resume(self, event) -> None:
        generator = self._generator
        while True:
            if generator is None:                 # start the next generator, or end
                generator = self._generator = next(self._generators, None)
                if generator is None:
                    self._ok, self._value, self._callback = True, None, None
                    callbacks, self.callbacks = self.callbacks, None      # what env.step does
                    for callback in callbacks:
                        callback(self)
                    return
                event = _STARTED
            try:
                if event._ok:
                    event = generator.send(event._value)
                else:                        # a failed event: the generator gets its exception,
                    event._defused = True    # as in a process
                    event = generator.throw(event._value)
            except StopIteration:
                generator = self._generator = None
                continue
            callbacks = event.callbacks
            if callbacks is not None:
                callbacks.append(self._callback)
                return
            # the event was processed already: go on at once, as a process does


class _Started:
    """What a generator is first resumed with (a succeeded event with no value)."""
    _ok = True
    _value = None


_STARTED = _Started()


class Flag:
    """An event that succeeds once with no value (see `flags`)."""

    __slots__ = ("callbacks", "_fire_after")
    _ok = True
    _value = None

    def succeed(self) -> "Flag":
        """Release the waiters (their callbacks run when the event is processed, now)."""
        fire_after = self._fire_after
        if fire_after is None:
            raise RuntimeError("a Flag succeeds once")
        self._fire_after = None
        fire_after(self, 0.0)           # what Event.succeed's env.schedule does
        return self


def flags(env: simpy.Environment):
    """`flag()`: a new Flag of `env`."""
    fire_after = schedulers(env)

    def flag() -> Flag:
        ev = Flag()
        ev.callbacks, ev._fire_after = [], fire_after
        return ev

    return flag


class Role:
    """A generator run as `env.process(generator)` runs it, scheduling the same events (see the
    module docstring); yield it to wait for the generator's end (its value: the generator's
    return value). An exception in the generator propagates out of the environment's step."""

    __slots__ = ("callbacks", "_value", "_generator", "_callback", "_env")
    _ok = True

    def __init__(self, env: simpy.Environment, generator):
        self.callbacks, self._value, self._generator, self._env = [], None, generator, env
        self._callback = self._resume         # bound once: appended to every event waited for
        start = Timer()                       # Process's Initialize: urgent, now
        start.callbacks = [self._callback]
        heappush(env._queue, (env._now, URGENT, next(env._eid), start))

    def _resume(self, event) -> None:
        generator, env = self._generator, self._env
        env._active_proc = self                # env.active_process names the role (shared_pipes.py)
        while True:
            try:
                if event._ok:
                    event = generator.send(event._value)
                else:                          # a failed event: the generator gets its exception
                    event._defused = True
                    event = generator.throw(event._value)
            except StopIteration as stop:      # the role ended: scheduled as Process schedules itself
                self._value, self._callback = stop.value, None
                heappush(env._queue, (env._now, NORMAL, next(env._eid), self))
                break
            callbacks = event.callbacks
            if callbacks is not None:
                callbacks.append(self._callback)
                break
            # the event was processed already: go on at once, as a process does
        env._active_proc = None


def run(env: simpy.Environment) -> None:
    """`env.run()` until no event is left, as SimPy's run and step do it (one loop, no method call
    an event)."""
    queue = env._queue
    while queue:
        env._now, _, _, event = heappop(queue)
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):     # a failed event nobody handled
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc


def events_scheduled(env: simpy.Environment) -> int:
    """Events `env` has scheduled so far (SimPy's event counter; reading it advances it by one)."""
    return next(env._eid)

