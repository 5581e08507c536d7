"""The only place hbmsim touches SimPy's internals (pinned to simpy 4 in pyproject.toml).

- `Completion`: an event created when a request is issued and scheduled later, when the pool
  knows its finish time (what simpy.Timeout's constructor does, for an existing event).
- `events_scheduled(env)`: how many events an environment has scheduled (SimPy numbers them).
"""
from __future__ import annotations

import simpy
from simpy.events import NORMAL


class Completion(simpy.Event):
    """An event that a pool fires some time after the request's service ends."""

    __slots__ = ()

    def fire_after(self, delay_s: float) -> None:
        # What simpy.Timeout.__init__ does, for an event created earlier.
        self._ok = True
        self._value = None
        self.env.schedule(self, NORMAL, delay_s)


def events_scheduled(env: simpy.Environment) -> int:
    """Events `env` has scheduled so far (SimPy's event counter; reading it advances it by one)."""
    return next(env._eid)
