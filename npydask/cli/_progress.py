"""One progress line on stderr: in place on a terminal, a line now and then in a log.

Scans and dask's progress bars (the local scheduler's ``ProgressBar``,
``distributed.progress``) write to a :class:`ProgressLine`: on a terminal it
redraws one line at most 10 times a second; when stderr is a file or a pipe
it writes the first text, then one line every ``LINE_EVERY`` seconds, and
the last text, so a log shows progress without thousands of carriage
returns.
"""

from __future__ import annotations

import contextlib
import io
import math
import sys
import time
from collections.abc import Iterator
from typing import IO

__all__ = ["LINE_EVERY", "ProgressLine", "progress_line"]

LINE_EVERY = 5.0  # seconds between progress lines when stderr is not a terminal


class ProgressLine(io.TextIOBase):
    """One progress line on ``stream``: in place on a terminal, periodic whole lines otherwise.

    :meth:`update` shows a new text (at most 10 times a second on a
    terminal; on a file or pipe the first text, then one every ``every``
    seconds); :meth:`finish` shows the last text if it was not shown and
    ends the line. It is also a text file that dask's and distributed's
    progress bars write to (``"\\r"`` starts a new text, ``"\\n"`` ends it).
    """

    def __init__(self, stream: IO[str], *, every: float | None = None) -> None:
        super().__init__()
        self._stream = stream
        self._tty = bool(getattr(stream, "isatty", lambda: False)())
        self._every = (0.1 if self._tty else LINE_EVERY) if every is None else every
        self._pending = ""
        self._shown = ""
        self._last = -math.inf

    def writable(self) -> bool:
        return True

    def update(self, text: str) -> None:
        """Show ``text`` now or soon."""
        self._pending = text
        now = time.monotonic()
        if now - self._last >= self._every:
            self._show(text)
            self._last = now

    def finish(self) -> None:
        """Show the last text if it was not shown, and end the line (on a terminal)."""
        if self._pending and self._pending != self._shown:
            self._show(self._pending)
        if self._tty and self._shown:
            self._stream.write("\n")
            self._stream.flush()
        self._pending = self._shown = ""
        self._last = -math.inf

    def _show(self, text: str) -> None:
        self._stream.write(f"\r{text}\x1b[K" if self._tty else text + "\n")
        self._stream.flush()
        self._shown = text

    def write(self, s: str) -> int:
        """What a progress bar draws: texts after ``"\\r"``, ``"\\n"`` (or a line clear) ends the bar."""
        done = "\n" in s or "\x1b[2K" in s
        for piece in s.replace("\x1b[2K", "").split("\r"):
            piece = piece.rstrip("\n")
            if piece.strip():
                self.update(piece)
        if done:
            self.finish()
        return len(s)

    def flush(self) -> None:
        self._stream.flush()


@contextlib.contextmanager
def progress_line(quiet: bool) -> Iterator[ProgressLine | None]:
    """A :class:`ProgressLine` on stderr, finished on exit (``None`` when ``quiet``)."""
    if quiet:
        yield None
        return
    line = ProgressLine(sys.stderr)
    try:
        yield line
    finally:
        line.finish()
