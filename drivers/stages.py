"""The stages of one driving tick and their clock: what ``timings_ms`` holds and what a profile of a tick names.

Example:
    >>> clock = StageClock(start="preprocess")
    >>> _ = clock.to("encode"); _ = clock.to(None)
    >>> list(clock.timings_ms()) == list(STAGES)
    True
"""

from __future__ import annotations

import time

import torch

__all__ = ["STAGES", "StageClock"]

STAGES = ("preprocess", "encode", "prefill", "decode", "action", "total")


class StageClock:
    """One tick's stage clock: :meth:`to` ends the running stage and starts the next, adding wall time per stage name
    (a stage may run in pieces, and nest: :meth:`to` returns the stage it ended, to go back to). Each piece is also a
    ``torch.profiler`` range named ``drive.<stage>``, so a profile of a tick names its stages as ``timings_ms`` does
    (``results/drivers/drive-sim/studies/tick_profile.py``); outside a profiler a range costs ~6 us.

    Example:
        >>> clock = StageClock(start="preprocess")
        >>> _ = clock.to("encode"); _ = clock.to("prefill"); _ = clock.to(None)
        >>> sorted(clock.seconds), clock.end >= clock.t0
        (['encode', 'prefill', 'preprocess'], True)
    """

    def __init__(self, sync=None, start: str | None = None):
        self.sync = sync
        self.seconds: dict = {}
        self.stage = self._range = None
        self.to(start)
        self.t0 = self._since

    def to(self, stage: str | None):
        """End the running stage (if any) and start ``stage`` (``None``: stop the clock); returns the stage ended."""
        if self.sync is not None:
            self.sync()
        now = time.perf_counter()
        ended = self.stage
        if ended is not None:
            self.seconds[ended] = self.seconds.get(ended, 0.0) + (now - self._since)
            self._range.__exit__(None, None, None)
        self.stage, self._since, self.end = stage, now, now
        self._range = None
        if stage is not None:
            self._range = torch.profiler.record_function(f"drive.{stage}")
            self._range.__enter__()
        return ended

    def close(self) -> None:
        """Close an open range without timing it (a tick that raised)."""
        if self._range is not None:
            self._range.__exit__(None, None, None)
        self.stage, self._range = None, None

    def timings_ms(self) -> dict:
        """Every :data:`STAGES` entry in ms (``0`` for a stage that did not run); ``total`` from ``t0`` to the stop."""
        out = {k: self.seconds.get(k, 0.0) * 1e3 for k in STAGES if k != "total"}
        out["total"] = (self.end - self.t0) * 1e3
        return out
