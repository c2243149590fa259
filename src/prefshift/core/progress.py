"""Plain progress lines for long loops (training, reference pass, scoring, generation, probes).

Why plain lines: a stage often runs with no terminal (a sweep's task, a SLURM job, `dvc repro >
log`). A rich bar there draws nothing until it stops, so a 25-minute training stage left
its log empty until the end. Every long loop instead prints one self-contained line now and then:

    train naive: 120/600 steps (20.0%) | loss 0.6812 acc 0.563 | 41.3 pairs/s | 29s elapsed | ETA 1m56s

The same lines go to a terminal. They are written to stdout and flushed at once, so they land
in a redirected log as they happen. A line is printed when the loop starts, when it ends, and in
between whenever `PREFSHIFT_PROGRESS_EVERY_S` seconds (default 15; 0 = every update) have passed.
The period is an environment variable rather than a param: how often a run reports must not make
DVC re-run a stage.

Reporting reads only values the loop already has (a clock, counters, numbers it computed), so
it never changes what a run computes.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import IO, TypeVar

from prefshift.core.errors import PrefshiftError

EVERY_ENV = "PREFSHIFT_PROGRESS_EVERY_S"
DEFAULT_EVERY_S = 15.0

T = TypeVar("T")
_redirect: list[IO[str] | None] = []


def every_s() -> float:
    """Seconds between periodic lines, from `PREFSHIFT_PROGRESS_EVERY_S`."""
    raw = os.environ.get(EVERY_ENV, "").strip()
    if not raw:
        return DEFAULT_EVERY_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise PrefshiftError(
            f"{EVERY_ENV}={raw!r}: expected the seconds between progress lines, a number >= 0 (e.g. 15)"
        )
    return value


@contextmanager
def lines_to(stream: IO[str] | None) -> Iterator[None]:
    """Send progress lines to `stream` instead of stdout, e.g. while stdout carries a command's data;
    None drops them (a library call such as a pyfunc `predict` is not a long-running stage)."""
    _redirect.append(stream)
    try:
        yield
    finally:
        _redirect.pop()


def _main_process() -> bool:
    """False in every process but the first of a multi-process launch (torchrun and `accelerate
    launch` set RANK), so N processes training one model print one set of lines."""
    return os.environ.get("RANK", "0").strip() in ("", "0")


def duration(seconds: float) -> str:
    """`12s`, `4m05s`, `1h02m`: short enough for a log line, exact enough to plan by."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class ProgressReporter:
    """Counts a loop's progress and prints a line at its start, its end, and every period between.

    `done` counts `unit`s (steps, pairs, prompts) towards `total`; the rate is in `rate_unit`s
    per second (pairs/s while counting steps), from the `items` the caller reports, or from
    `done` when both units are the same. `start` is where a resumed loop begins: the rate and
    the time left count only the work done here.
    """

    def __init__(
        self,
        label: str,
        total: int,
        unit: str = "pairs",
        *,
        rate_unit: str | None = None,
        start: int = 0,
        enabled: bool = True,
        period_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.label, self.total, self.unit = label, total, unit
        self.rate_unit = rate_unit or unit
        self.start = self.done = start
        self.items = 0
        self.values: dict[str, float] = {}
        self.enabled = enabled and total > 0 and _main_process()
        self.period_s = every_s() if period_s is None else period_s
        self.clock = clock
        self.began = self.last_line = clock()
        self.lines = 0
        if self.enabled:
            self._emit(self._counts() + " | started")

    def update(self, done: int, *, items: int | None = None, **values: float) -> None:
        """Record progress (`done` so far, `items` handled since the start) and print when a line is due."""
        self.done = done
        self.items = done - self.start if items is None else items
        self.values = values
        if self.enabled and self.clock() - self.last_line >= self.period_s and done < self.total:
            self._emit(self.line())

    def finish(self) -> None:
        """The last line: where the loop ended, its rate and its total time."""
        if self.enabled:
            self._emit(self.line())
            self.enabled = False

    def __enter__(self) -> ProgressReporter:
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.finish()

    def line(self) -> str:
        elapsed = self.clock() - self.began
        parts = [self._counts()]
        if self.values:
            parts.append(" ".join(f"{k} {v:.4g}" for k, v in self.values.items()))
        rate = self.items / elapsed if elapsed > 0 else math.nan
        parts.append(f"{rate:.1f} {self.rate_unit}/s" if math.isfinite(rate) else f"? {self.rate_unit}/s")
        parts.append(f"{duration(elapsed)} elapsed")
        parts.append(f"ETA {self._left(elapsed)}")
        return " | ".join(parts)

    def _counts(self) -> str:
        share = 100.0 * self.done / self.total if self.total else 100.0
        return f"{self.label}: {self.done}/{self.total} {self.unit} ({share:.1f}%)"

    def _left(self, elapsed: float) -> str:
        if self.done >= self.total:
            return "0s"
        progressed = self.done - self.start
        if progressed <= 0:
            return "?"
        return duration((self.total - self.done) * elapsed / progressed)

    def _emit(self, text: str) -> None:
        stream = _redirect[-1] if _redirect else sys.stdout
        if stream is not None:
            print(text, file=stream, flush=True)
        self.last_line = self.clock()
        self.lines += 1


def track(
    items: Iterable[T],
    label: str,
    total: int,
    unit: str = "pairs",
    size: Callable[[T], int] = len,
    **options,
) -> Iterator[T]:
    """Yield `items`, reporting `size(item)` units done once the loop body has handled each one."""
    reporter = ProgressReporter(label, total, unit, **options)
    done = 0
    for item in items:
        yield item
        done += size(item)
        reporter.update(done)
    reporter.finish()
