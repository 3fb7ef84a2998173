"""A driver JVM's stderr passed on to ours, less what Spark's machinery says to nobody.

The command line promises one line for any error. A JVM started here writes to a pipe that
`StderrRelay` reads for the JVM's life: what it says while it starts is held back (and dropped
if it is only the start-up chatter, `_START_NOISE`), and after that `Sieve` drops three kinds of
lines a user has no use for, passing everything else on at once:

- the chatter of pyspark's streaming workers (a line per micro-batch of a ``foreachBatch``
  query, a few lines and blank lines at each start of a ``transformWithStateInPandas`` query);
- the traceback pyspark's worker daemon prints for a worker whose connection to the JVM broke
  as it finished (an ``EOFError`` or a broken pipe raised in ``daemon.py``'s ``manager``): the
  JVM closes that connection when it cancels a task, which it does to a failed job's other
  tasks, so the traceback would come beside the job's own one-line error, or in a later
  command's output, timing deciding which (it happens rarely: the task has to be at its very end);
- nothing else: any other traceback is passed on whole.

A traceback is held until it ends: at a line that is not part of it, or when the pipe has been
quiet for `QUIET_SECONDS` (a worker's lines come through the JVM's copier thread at once).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import sys
import threading
from typing import IO, Any, Final

__all__ = ("QUIET_SECONDS", "Sieve", "StderrRelay")

#: What a driver's JVM says while it starts that a user has no use for: the JVM's note on
#: Spark's incubator module, log4j's profile, the default log level, the native Hadoop library.
_START_NOISE: Final = re.compile(
    rb"^(WARNING: Using incubator modules: |Using Spark's default log4j profile: |Setting "
    rb"default log level to |To adjust logging level use sc\.setLogLevel|\S+ \S+ WARN "
    rb"NativeCodeLoader: Unable to load native-hadoop library)"
)
#: What the JVM relays from pyspark's streaming workers: a ``foreachBatch`` worker's line per
#: micro-batch (its server's URL with the token in it), a ``transformWithStateInPandas`` driver
#: worker's lines at each query start (each followed by a blank line: it prints ``"...\n"``).
_CHATTER: Final = re.compile(
    rb"^(Streaming (ForeachBatch|query listener) worker |(Starting )?Streaming "
    rb"TransformWithStateInPandas Python worker)"
)
#: The beginnings of the lines `Sieve` acts on: a partial line that may grow into one of them
#: waits for its end; any other partial line (a progress bar's) is passed on at once.
_ACTED_ON: Final = (b"Streaming ", b"Starting Streaming ", b"Traceback ")

_TRACEBACK: Final = b"Traceback (most recent call last):"
_CHAINED: Final = (
    b"During handling of the above exception, another exception occurred:",
    b"The above exception was the direct cause of the following exception:",
)
#: The daemon's frame that runs a forked worker: a traceback through it escaped the worker.
_DAEMON_FRAME: Final = re.compile(rb'pyspark[/\\]daemon\.py", line \d+, in manager$')
#: A worker's connection to the JVM broken under it.
_BROKEN: Final = re.compile(
    rb"^(EOFError|BrokenPipeError|ConnectionResetError|ConnectionAbortedError)\b"
)
#: How long a held traceback waits for another line before it is taken as ended.
QUIET_SECONDS: Final = 0.5


class Sieve:
    """What of a JVM's stderr to pass on, a complete line at a time (`feed`); `quiet` says
    that no line came for a while. Each returns the lines to write now."""

    def __init__(self) -> None:
        self._trace: list[bytes] = []
        self._after_chatter = False

    @property
    def holding(self) -> bool:
        """Whether a traceback is held, waiting for its end."""
        return bool(self._trace)

    def feed(self, line: bytes) -> list[bytes]:
        text = line.rstrip(b"\r\n")
        if self._trace:
            if _continues(self._trace, text):
                self._trace.append(line)
                return []
            return [*self._release(), *self.feed(line)]
        after_chatter, self._after_chatter = self._after_chatter, False
        if text == _TRACEBACK:
            self._trace = [line]
            return []
        if _CHATTER.match(text):
            self._after_chatter = True
            return []
        if after_chatter and not text.strip():
            return []
        return [line]

    def quiet(self) -> list[bytes]:
        return self._release()

    def _release(self) -> list[bytes]:
        trace, self._trace = self._trace, []
        return [] if _worker_cut_off(trace) else trace


def _continues(trace: list[bytes], text: bytes) -> bool:
    """Whether `text` continues the traceback held: a frame's lines (indented), a blank line, a
    chained exception's header, or the exception's line after the frames."""
    if not text.strip() or text.startswith((b" ", b"\t")) or text in _CHAINED:
        return True
    last = next((line for line in reversed(trace) if line.strip()), b"").rstrip(b"\r\n")
    if text == _TRACEBACK:
        return last in _CHAINED  # (else another traceback begins)
    return last.startswith((b" ", b"\t"))  # (the exception's line ends the frames)


def _worker_cut_off(trace: list[bytes]) -> bool:
    """Whether `trace` is the daemon's for a worker whose connection the JVM closed."""
    lines = [line.rstrip(b"\r\n") for line in trace]
    last = next((line for line in reversed(lines) if line.strip()), b"")
    return any(_DAEMON_FRAME.search(line) for line in lines) and bool(_BROKEN.match(last))


class StderrRelay:
    """Passes a JVM's stderr (the read end of its pipe) on to ours through a `Sieve`, from a
    daemon thread, for the JVM's life. What it says before `started` is held back, less its
    start-up lines, and written then, or given by `failed` (a JVM that died at its start)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._fd = stream.fileno()
        self._stream = stream  # (kept open for the thread's life)
        self._sieve = Sieve()
        self._starting = threading.Event()
        self._starting.set()
        self._lock = threading.Lock()
        self._held: list[bytes] = []
        self._thread = threading.Thread(target=self._run, name="purgatory-jvm-stderr", daemon=True)
        self._thread.start()

    def started(self) -> None:
        with self._lock:
            self._starting.clear()
            held, self._held = self._held, []
        if held:
            _write(b"".join(held))

    def failed(self, seconds: float = 10.0) -> list[str]:
        """What the JVM said (less its start-up lines), once it closed its stderr."""
        self._thread.join(seconds)
        with self._lock:
            self._starting.clear()
            held, self._held = self._held, []
        return b"".join(held).decode("utf-8", errors="replace").splitlines()

    def _run(self) -> None:
        pending = b""
        while True:
            if self._sieve.holding and not _readable(self._fd, QUIET_SECONDS):
                _pass_on(self._sieve.quiet())
                continue
            try:
                data = os.read(self._fd, 65536)
            except OSError:
                data = b""
            if not data:
                break
            lines = (pending + data).split(b"\n")
            pending = lines.pop()
            with self._lock:
                if self._starting.is_set():
                    self._held += [line + b"\n" for line in lines if not _START_NOISE.match(line)]
                    continue
            kept = [out for line in lines for out in self._sieve.feed(line + b"\n")]
            if pending and not self._sieve.holding and not _may_become_acted_on(pending):
                kept.append(pending)  # (a line in progress: a progress bar's)
                pending = b""
            _pass_on(kept)
        with self._lock:
            if pending and self._starting.is_set():
                self._held.append(pending)
                pending = b""
        tail = self._sieve.feed(pending) if pending else []
        _pass_on([*tail, *self._sieve.quiet()])
        with contextlib.suppress(OSError):
            self._stream.close()


def _pass_on(lines: list[bytes]) -> None:
    if lines:
        _write(b"".join(lines))


def _readable(fd: int, seconds: float) -> bool:
    try:
        ready, _, _ = select.select([fd], [], [], seconds)
    except (OSError, ValueError):
        return True  # (the read then ends the loop)
    return bool(ready)


def _may_become_acted_on(partial: bytes) -> bool:
    return any(partial.startswith(p) or p.startswith(partial) for p in _ACTED_ON)


def _write(data: bytes) -> None:
    stream: Any = sys.stderr
    try:
        stream.buffer.write(data)
        stream.buffer.flush()
    except (AttributeError, OSError, ValueError):
        with contextlib.suppress(OSError, ValueError):
            stream.write(data.decode("utf-8", errors="replace"))
            stream.flush()
