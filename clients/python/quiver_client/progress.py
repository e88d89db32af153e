"""Progress of a push: a rich bar (bytes, rate, ETA) on a terminal, one plain line per part otherwise (CI logs).

Every reporter is thread-safe: part uploads report from worker threads.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

MIB = 1024 * 1024


class Reporter(Protocol):
    """What the uploader tells about its progress."""

    def stage(self, text: str) -> None:
        """A step begins ("validating locally", "waiting for validation"...)."""

    def begin(self, *, total_bytes: int, done_bytes: int, parts_total: int, parts_done: int) -> None:
        """The part uploads begin; ``done_*`` are what the server already holds (a resumed push)."""

    def advance(self, nbytes: int) -> None:
        """``nbytes`` more bytes sent (negative when a failed part attempt is taken back)."""

    def part_done(self) -> None:
        """One more part is stored."""

    def end(self) -> None:
        """The part uploads are over (done or interrupted)."""


class Silent:
    """Reports nothing (``--quiet``, ``--json``, library use)."""

    def stage(self, text: str) -> None:
        """Ignored."""

    def begin(self, *, total_bytes: int, done_bytes: int, parts_total: int, parts_done: int) -> None:
        """Ignored."""

    def advance(self, nbytes: int) -> None:
        """Ignored."""

    def part_done(self) -> None:
        """Ignored."""

    def end(self) -> None:
        """Ignored."""


class Lines:
    """One line per stage and per stored part, e.g. ``quiver: 5/10 parts, 25.0/48.0 MiB (52%), 80.1 MiB/s``."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self._out = out or sys.stderr
        self._lock = threading.Lock()
        self._total = self._done = self._parts_total = self._parts_done = 0
        self._started = time.monotonic()
        self._sent = 0

    def _say(self, text: str) -> None:
        print(f"quiver: {text}", file=self._out, flush=True)

    def stage(self, text: str) -> None:
        """Print the stage."""
        with self._lock:
            self._say(text)

    def begin(self, *, total_bytes: int, done_bytes: int, parts_total: int, parts_done: int) -> None:
        """Print what is left to send."""
        with self._lock:
            self._total, self._done, self._parts_total, self._parts_done = total_bytes, done_bytes, parts_total, parts_done
            self._started = time.monotonic()
            resumed = f" ({parts_done} already stored, not sent again)" if parts_done else ""
            self._say(f"uploading {parts_total - parts_done} of {parts_total} parts, "
                      f"{(total_bytes - done_bytes) / MIB:.1f} MiB{resumed}")

    def advance(self, nbytes: int) -> None:
        """Count the bytes."""
        with self._lock:
            self._done += nbytes
            self._sent += nbytes

    def part_done(self) -> None:
        """Print the parts and bytes stored so far."""
        with self._lock:
            self._parts_done += 1
            rate = self._sent / max(time.monotonic() - self._started, 1e-6) / MIB
            pct = 100 * self._done // max(self._total, 1)
            self._say(f"{self._parts_done}/{self._parts_total} parts, {self._done / MIB:.1f}/{self._total / MIB:.1f} "
                      f"MiB ({pct}%), {rate:.1f} MiB/s")

    def end(self) -> None:
        """Nothing to close."""


class Bar:
    """A rich progress bar on stderr: bytes, rate and time left."""

    def __init__(self, console: Console | None = None) -> None:
        self._console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def stage(self, text: str) -> None:
        """Print the stage above the bar."""
        self._console.print(f"[dim]quiver:[/dim] {text}")

    def begin(self, *, total_bytes: int, done_bytes: int, parts_total: int, parts_done: int) -> None:
        """Start the bar at what the server already holds."""
        self._progress = Progress(TextColumn("[bold]uploading"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                  TimeRemainingColumn(), console=self._console, transient=False)
        self._progress.start()
        self._task = self._progress.add_task("upload", total=total_bytes, completed=done_bytes)
        if parts_done:
            self.stage(f"resuming: {parts_done} of {parts_total} parts already stored, not sent again")

    def advance(self, nbytes: int) -> None:
        """Move the bar."""
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, nbytes)

    def part_done(self) -> None:
        """The bar counts bytes; nothing more to show."""

    def end(self) -> None:
        """Stop the bar."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def for_terminal(*, quiet: bool = False) -> Reporter:
    """A bar when stderr is a terminal, plain lines otherwise, nothing with ``quiet``."""
    if quiet:
        return Silent()
    return Bar() if sys.stderr.isatty() else Lines()
