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
- `events_scheduled(env)`: how many events an environment has scheduled (SimPy numbers them).
"""
from __future__ import annotations

from heapq import heappush

import simpy
from simpy.events import NORMAL


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


def events_scheduled(env: simpy.Environment) -> int:
    """Events `env` has scheduled so far (SimPy's event counter; reading it advances it by one)."""
    return next(env._eid)

