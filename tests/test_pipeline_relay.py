"""What of a driver JVM's stderr reaches the user (`purgatory.pipeline._relay`).

The command line's one-line errors must not come with pyspark's chatter: a worker daemon's
traceback for a worker the JVM cut off (a failed job's other task, cancelled at its very end:
it once came beside ``analyze``'s one-line error), the streaming workers' start-up lines. Every
other line, and every other traceback, passes whole. The sieve is tested line by line, the relay
on a real pipe (the traceback's end found by the pipe's quiet).
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from purgatory.pipeline import _relay
from purgatory.pipeline._relay import Sieve, StderrRelay

ZIP = "/venv/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark"

#: The daemon's traceback for a worker whose socket the JVM closed as the worker finished
#: (its end-of-stream read failed, then its write of the "do not reuse me" marker).
CUT_OFF = f"""\
Traceback (most recent call last):
  File "{ZIP}/worker.py", line 4350, in invoke_udf
    message_receiver.get_finish_signal_from_stream()
  File "{ZIP}/serializers.py", line 596, in read_int
    raise EOFError
EOFError

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "{ZIP}/daemon.py", line 264, in manager
    code = worker(sock, authenticated)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{ZIP}/daemon.py", line 88, in worker
    worker_main(infile, outfile)
  File "{ZIP}/worker.py", line 4354, in invoke_udf
    write_int(SpecialLengths.END_OF_DATA_SECTION, outfile)
  File "{ZIP}/serializers.py", line 610, in write_int
    stream.write(struct.pack("!i", value))
BrokenPipeError: [Errno 32] Broken pipe
"""

#: The same daemon, a worker that failed otherwise: the user must see it.
OTHER_FAILURE = f"""\
Traceback (most recent call last):
  File "{ZIP}/daemon.py", line 264, in manager
    code = worker(sock, authenticated)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{ZIP}/daemon.py", line 80, in worker
    worker_module = importlib.import_module(sys.argv[1])
ModuleNotFoundError: No module named 'purgatory'
"""

#: A broken connection that is not a worker's (no daemon frame): passed on too.
NOT_A_WORKER = """\
Traceback (most recent call last):
  File "/app/server.py", line 12, in serve
    read_request(conn)
EOFError
"""

#: A transformWithStateInPandas driver worker's start, as it prints it ("...\\n": blank lines).
STATEFUL_START = """\
Starting Streaming TransformWithStateInPandas Python worker.

Streaming TransformWithStateInPandas Python worker finish init stage of Python runner. Received UDF

Streaming TransformWithStateInPandas Python worker Completed execution of UDF: <bound method>

"""


def sieved(text: str) -> str:
    sieve = Sieve()
    out = [line for raw in text.splitlines(keepends=True) for line in sieve.feed(raw.encode())]
    return b"".join([*out, *sieve.quiet()]).decode()


def test_a_worker_cut_off_by_the_jvm_is_dropped_and_the_lines_around_it_pass() -> None:
    assert sieved(f"before\n{CUT_OFF}after\n") == "before\nafter\n"
    assert sieved(CUT_OFF.replace("BrokenPipeError: [Errno 32] Broken pipe", "EOFError")) == ""


@pytest.mark.parametrize("trace", [OTHER_FAILURE, NOT_A_WORKER], ids=["other-error", "no-daemon"])
def test_any_other_traceback_passes_whole(trace: str) -> None:
    assert sieved(f"before\n{trace}after\n") == f"before\n{trace}after\n"
    assert sieved(trace) == trace  # (ended by the quiet, not by a line after it)


def test_a_traceback_then_another_each_judged_alone() -> None:
    assert sieved(CUT_OFF + OTHER_FAILURE + CUT_OFF) == OTHER_FAILURE


def test_the_streaming_workers_chatter_goes_other_blank_lines_stay() -> None:
    foreach = "Streaming ForeachBatch worker is starting with url sc://localhost:1/;token=x\n"
    assert sieved(f"a\n\n{STATEFUL_START}{foreach}b\n") == "a\n\nb\n"


@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    got: list[bytes] = []
    lock = threading.Lock()

    def write(data: bytes) -> None:
        with lock:
            got.append(data)

    monkeypatch.setattr(_relay, "_write", write)
    return got


def wait_for(got: list[bytes], text: str, seconds: float = 30.0) -> str:
    """What the relay wrote once it wrote `text` (or at the deadline)."""
    deadline = time.monotonic() + seconds
    while text not in b"".join(got).decode() and time.monotonic() < deadline:
        time.sleep(0.01)
    return b"".join(got).decode()


def test_the_relay_on_a_pipe_holds_a_traceback_until_the_pipe_is_quiet(
    written: list[bytes],
) -> None:
    read, write = os.pipe()
    relay = StderrRelay(os.fdopen(read, "rb", buffering=0))
    relay.started()
    try:
        os.write(write, b"one\n" + CUT_OFF.encode())
        assert wait_for(written, "one\n") == "one\n"
        os.write(write, OTHER_FAILURE.encode())
        # Not ended by a line: by the pipe's quiet, then passed whole, the cut-off one dropped.
        assert wait_for(written, "ModuleNotFoundError") == "one\n" + OTHER_FAILURE
        os.write(write, b"[Stage 0:>  (0 + 2) / 2]\r")  # a progress bar's line: at once
        assert wait_for(written, "(0 + 2) / 2]\r").endswith("[Stage 0:>  (0 + 2) / 2]\r")
    finally:
        os.close(write)
    relay._thread.join(10)
    assert not relay._thread.is_alive()


def test_what_a_jvm_said_as_it_died_at_its_start_is_given_not_written(
    written: list[bytes],
) -> None:
    read, write = os.pipe()
    relay = StderrRelay(os.fdopen(read, "rb", buffering=0))
    os.write(write, b"Using Spark's default log4j profile: x\nError: no such class\nlast")
    os.close(write)
    assert relay.failed() == ["Error: no such class", "last"]
    assert written == []
