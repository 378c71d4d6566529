"""Where the engine reads the time: a wall clock (epoch seconds, comparable across machines) and a monotonic
clock (for deadlines inside one process). Code that applies a timing rule takes a `Clock`, so a test or a
simulation passes a virtual one and checks the rule exactly instead of sleeping."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall(self) -> float:
        """Seconds since the epoch."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (meaningful only within one process)."""


class SystemClock:
    """The machine's clocks: the builtins themselves, as the daemon reads them a dozen times per request."""

    wall = staticmethod(time.time)
    monotonic = staticmethod(time.monotonic)


SYSTEM_CLOCK = SystemClock()
