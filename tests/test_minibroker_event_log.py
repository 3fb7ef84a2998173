"""``serve --event-log DIR``: the leader's purgatories record their operations while it runs.

A real ``serve`` process with a short publication interval: a long-poll fetch that expires and
an ``acks=all`` produce are recorded, the files appear in DIR while the broker still runs (what
``analyze --follow`` needs), every file is anchored to UTC, and the pipeline's reader reads them
(no Spark here: the reader a Spark task runs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from minibroker_support import RawClient, batch, fetch, produce, produce_errors, run

from purgatory.pipeline._eventfile import event_batches

REPO_ROOT = Path(__file__).resolve().parent.parent


def operations(directory: Path, *, watches: bool = False) -> pa.Table:
    """Every operation of the published files, as the ``purgatory-events`` source reads them
    (`watches`: with the watch records, as its ``watchRecords`` option)."""
    batches = []
    for file in sorted(directory.glob("*.jsonl")):
        with file.open("rb") as source:
            batches += list(event_batches(file.name, source, require_utc=True, watches=watches))
    return pa.Table.from_batches(batches) if batches else pa.table({"purgatory": []})


@pytest.mark.parametrize("watches", [False, True], ids=["ends", "watches-too"])
def test_serve_records_what_its_purgatories_park_and_publishes_it_as_it_runs(
    tmp_path: Path, watches: bool
) -> None:
    """With ``--event-log-watches`` each operation is also recorded as it is watched, which
    ``analyze --follow --stuck`` needs (without, a job over these logs can report nothing)."""
    events = tmp_path / "events"
    command = [sys.executable, "-m", "examples.minibroker", "serve", "--port", "0"]
    command += ["--no-metrics", "--followers", "0", "--min-insync-replicas", "1"]
    command += ["--topics", "t:1", "--event-log", str(events), "--event-log-interval", "0.2"]
    command += ["--event-log-watches"] if watches else []
    with subprocess.Popen(
        command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    ) as process:
        try:
            assert process.stdout is not None
            port = int(process.stdout.readline().decode().rsplit(":", 1)[1])

            async def traffic() -> None:
                client = await RawClient.connect(port)
                await fetch(client, {("t", 0): 0}, max_wait_ms=100)  # parked, then expires
                response = await produce(client, "t", 0, batch(b"x"))  # acks=all
                assert produce_errors(response) == [0]
                await client.close()

            run(traffic, timeout=30)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # published while the broker runs
                if "fetch" in operations(events).column("purgatory").to_pylist():
                    break
                time.sleep(0.1)
            recorded = operations(events).to_pylist()
            assert {"fetch"} <= {row["purgatory"] for row in recorded}, recorded
            os.kill(process.pid, signal.SIGINT)
            assert process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert not list(events.glob("*.part"))  # the stop published the rest
    recorded = operations(events).to_pylist()
    fetches = [row for row in recorded if row["purgatory"] == "fetch"]
    assert fetches[0]["outcome"] == "expired"
    assert fetches[0]["keys"] == ["('t', 0)"]
    assert all(row["watched_utc"] is not None for row in recorded)  # anchored: UTC times
    outcomes = [
        (row["purgatory"], row["id"], row["outcome"])
        for row in operations(events, watches=True).to_pylist()
        if row["purgatory"] == "fetch"
    ]
    first = fetches[0]["id"]
    expected = [("fetch", first, "watched")] if watches else []
    assert [o for o in outcomes if o[1] == first] == [*expected, ("fetch", first, "expired")]
