"""The Spark the pipeline tests run on, written once.

- `local_session`: the one local[2] session the tests share (made by the pipeline's own
  `get_session`, so with its defaults: loopback only, no web UI, two shuffle partitions);
- `standalone_cluster` and `connect_server`: a standalone master with two workers, and a Spark
  Connect server, started from the pyspark wheel's own scripts as separate JVMs on loopback;
- `write_trace`: a valid two-row trace file with some columns replaced; `bad_trace`, files with
  bad rows and duplicate ids in several purgatories; `CONFIGS` and
  `small_w1`, the grid and the workload the replay tests share;
- `record_at`: event logs recorded as by a host at a given UTC time (anchored), and
  `follow_killed_and_restarted`, the test of ``analyze --follow`` that every kind of session
  runs: a job killed mid-stream and started again gives the windows of a batch ``analyze``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
from helpers import run_process

from purgatory import ArrowEventLog, JsonLinesEventLog
from purgatory.pipeline import W1, ReplayConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CONFIGS = [
    ReplayConfig(tick=0.001),
    # A coarse tick (many conditions land between a deadline and its rounding), a small wheel
    # (overflow levels and cascades), frequent purges, shorter timeouts, doubled traffic.
    ReplayConfig(
        tick=0.05,
        wheel_size=4,
        purge_interval=10,
        timeout_scale=0.5,
        rate_scale=2.0,
        trigger="force",
    ),
]


def small_w1(operations: int, seed: int, chunk: int = 200_000) -> W1:
    """Two purgatories of busy, short-lived traffic: 20 keys, 100 ms timeouts, a latency that
    often exceeds them, 5 % never completing; both outcomes well exercised."""
    return W1(
        purgatories=2,
        operations=operations,
        rate=2000.0,
        timeout=0.1,
        p50=0.04,
        p75=0.1,
        keys=20,
        never=0.05,
        seed=seed,
        chunk=chunk,
    )


#: How long a JVM may take to come up on a loaded 2-core machine.
STARTUP_SECONDS = 180
#: Every JVM the tests start compiles with C1 only and collects with one thread: they start in
#: about half the time on a busy 2-core machine, and the tests' jobs are small.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def local_session() -> Iterator[SparkSession]:
    """The tests' local[2] session, stopped when the tests are done."""
    from purgatory.pipeline import get_session
    from purgatory.pipeline._spark import quiet

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = get_session("local[2]", "purgatory-tests", {"spark.ui.showConsoleProgress": "false"})
    quiet(session, "ERROR")
    yield session
    session.stop()


def write_trace(path: Path, **changes: Any) -> Path:
    """A valid two-row trace file at `path` with some columns replaced (None: removed)."""
    columns: dict[str, Any] = {
        "purgatory": pa.array(["p", "p"]),
        "op_id": pa.array([0, 1], pa.int64()),
        "arrival": pa.array([0.0, 0.5]),
        "keys": pa.array([["a"], ["a", "b"]]),
        "timeout": pa.array([1.0, 1.0]),
        "condition_at": pa.array([0.25, None], pa.float64()),
    }
    for name, value in changes.items():
        if value is None:
            del columns[name]
        else:
            columns[name] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def bad_trace(directory: Path, without: Sequence[str | None] = ()) -> list[str]:
    """Two trace files (their URIs): purgatory a with 3 bad rows, b with 2 bad rows and a
    duplicate id, c with a duplicate id across the files, a row without a purgatory; less the
    rows of the purgatories `without`."""

    def write(name: str, rows: list[tuple[Any, ...]]) -> str:
        columns = list(zip(*[row for row in rows if row[0] not in without], strict=True))
        path = directory / name
        pq.write_table(
            pa.table(
                {
                    "purgatory": pa.array(columns[0], pa.string()),
                    "op_id": pa.array(columns[1], pa.int64()),
                    "arrival": pa.array(columns[2], pa.float64()),
                    "keys": pa.array(columns[3], pa.list_(pa.string())),
                    "timeout": pa.array(columns[4], pa.float64()),
                    "condition_at": pa.array(columns[5], pa.float64()),
                }
            ),
            path,
        )
        return path.resolve().as_uri()

    directory.mkdir()
    return [
        write(
            "part-0.parquet",
            [
                ("a", 5, 0.0, ["k"], -1.0, None),
                ("a", 2, 0.0, [], 1.0, None),
                ("b", 9, 0.5, ["k"], 1.0, 0.25),
                ("b", 1, 0.0, ["k"], 1.0, None),
                ("c", 4, 0.0, ["k"], 1.0, None),
                (None, 3, 0.0, ["k"], 1.0, None),
            ],
        ),
        write(
            "part-1.parquet",
            [
                ("a", 7, float("nan"), ["k"], 1.0, None),
                ("b", 1, 0.0, ["k"], 1.0, None),
                ("b", 3, 0.0, ["k"], 1e13, None),
                ("c", 4, 0.1, ["k"], 1.0, None),
            ],
        ),
    ]


def spark_home() -> Path:
    """The Spark distribution inside the pyspark wheel (bin/, sbin/, jars/)."""
    import pyspark

    return Path(pyspark.__file__).parent


def spark_env() -> dict[str, str]:
    """The environment of every JVM and pipeline process the tests start: this interpreter for
    Python workers, loopback for every address."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env["SPARK_HOME"] = str(spark_home())
    env["SPARK_DAEMON_JAVA_OPTS"] = QUICK_JVM  # the master's, the workers', Connect's
    env.pop("SPARK_REMOTE", None)
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Daemon:
    """A JVM started in the background, its output in a log file; stopped with its children."""

    def __init__(self, name: str, argv: Sequence[str], log: Path) -> None:
        self.name = name
        self.log = log
        self._file = log.open("wb")
        self.process = subprocess.Popen(
            argv,
            env=spark_env(),
            stdout=self._file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def wait_for(self, text: str) -> None:
        """Wait until `text` is in the log; fail with the log's tail if the JVM dies first."""
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if text in self.log.read_text(errors="replace"):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.25)
        tail = self.log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{self.name} did not start ({text!r} not seen):\n{tail}")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self._file.close()


@contextlib.contextmanager
def standalone_cluster(work: Path) -> Iterator[str]:
    """A standalone master and two one-core workers on loopback; yields the master's URL."""
    spark_class = str(spark_home() / "bin" / "spark-class")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    daemons = []
    try:
        master = Daemon(
            "master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())),
            ],
            work / "master.log",
        )
        daemons.append(master)
        master.wait_for("I have been elected leader")
        for i in (1, 2):
            worker = Daemon(
                f"worker {i}",
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    *("--host", "127.0.0.1", "--cores", "1", "--memory", "1g"),
                    *("--webui-port", str(free_port()), "--work-dir", str(work / f"worker-{i}")),
                    url,
                ],
                work / f"worker-{i}.log",
            )
            daemons.append(worker)
        for worker in daemons[1:]:
            worker.wait_for("Successfully registered with master")
        yield url
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


@contextlib.contextmanager
def connect_server(work: Path) -> Iterator[str]:
    """A Spark Connect server (local[2], loopback, no UI); yields its ``sc://`` URL."""
    port = free_port()
    server = Daemon(
        "Spark Connect server",
        [
            str(spark_home() / "bin" / "spark-submit"),
            *("--class", "org.apache.spark.sql.connect.service.SparkConnectServer"),
            *("--master", "local[2]", "--name", "purgatory-tests-connect"),
            *("--conf", "spark.connect.grpc.binding.address=127.0.0.1"),
            *("--conf", f"spark.connect.grpc.binding.port={port}"),
            *("--conf", "spark.ui.enabled=false"),
            *("--conf", "spark.driver.host=127.0.0.1"),
            *("--conf", "spark.driver.bindAddress=127.0.0.1"),
            *("--conf", "spark.sql.shuffle.partitions=2"),
            *("--conf", f"spark.driver.extraJavaOptions={QUICK_JVM}"),
        ],
        work / "connect.log",
    )
    try:
        server.wait_for("Spark Connect server started")
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.stop()


def pipeline(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m purgatory.pipeline ARGS`` in a process of its own (its own Spark driver, or
    a Spark Connect client), in `env` (default: `spark_env`)."""
    return run_process(
        sys.executable,
        "-m",
        "purgatory.pipeline",
        *args,
        cwd=cwd,
        env=spark_env() if env is None else env,
        timeout=600,
    )


def zipped_package(into: Path) -> Path:
    """The purgatory package as a zip, as a cluster user ships it (``--py-files``)."""
    import zipfile

    import purgatory

    package = Path(purgatory.__file__).parent
    bundle = into / "purgatory.zip"
    with zipfile.ZipFile(bundle, "w") as zf:
        for file in sorted(package.rglob("*")):
            if "__pycache__" not in file.parts and file.is_file():
                zf.write(file, file.relative_to(package.parent))
    return bundle


#: A driver that runs pipeline commands (JSON lists of arguments) in one process, as
#: spark-submit starts it: each command gets the session spark-submit's JVM holds.
DRIVER = """
import json, sys
from purgatory.pipeline._cli import main

for argv in json.loads(sys.argv[1]):
    code = main(argv)
    print(f"exit {code}", flush=True)
    if code:
        sys.exit(code)
"""


def spark_submit(
    master: str, commands: Sequence[Sequence[str]], *, cwd: Path
) -> subprocess.CompletedProcess[str]:
    """Pipeline `commands` run by one driver under ``spark-submit --master MASTER``, with the
    package shipped to the executors as a zip (``--py-files``): the cluster recipe."""
    import json

    driver = cwd / "driver.py"
    driver.write_text(DRIVER)
    env = spark_env()
    env.pop("PYTHONPATH", None)
    return run_process(
        spark_home() / "bin" / "spark-submit",
        *("--master", master, "--py-files", zipped_package(cwd)),
        *("--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m"),
        *("--conf", f"spark.driver.extraJavaOptions={QUICK_JVM}"),
        *("--conf", f"spark.executor.extraJavaOptions={QUICK_JVM}"),
        driver,
        json.dumps([list(command) for command in commands]),
        cwd=cwd,
        env=env,
        timeout=900,
    )


# -- event logs at known UTC times, and analyze --follow ------------------------------------

#: An instant of UTC the recorded operations are placed at (2027-01-15 08:00:00).
BASE_UTC = 1_800_000_000.0
#: The outcomes `record_at` gives its operations in turn (all but refused and open).
OUTCOMES = ("completed", "completed", "expired", "completed", "cancelled", "drained")


def record_at(
    directory: Path,
    name: str,
    utc: float,
    count: int,
    *,
    recorder: type[JsonLinesEventLog] | type[ArrowEventLog] = JsonLinesEventLog,
    spacing: float = 0.25,
    clock_start: float = 1000.0,
) -> None:
    """`count` operations of purgatory `name` recorded into `directory` as by a host whose
    clock read `clock_start` when UTC was `utc` (anchored files): one watched every `spacing`
    seconds, each ended 0.1 s later (0.5 s when expired) with the outcomes of `OUTCOMES` in
    turn. Files are published whole, as recorders publish them."""
    from helpers import FlagOperation

    now = [clock_start]
    wall = utc - clock_start
    with pytest_monkeypatch() as patch:
        patch.setattr(time, "time", lambda: wall + now[0])
        log = recorder(directory, buffer_lines=8, clock=lambda: now[0])
        for i in range(count):
            op = FlagOperation(0.5)
            now[0] = clock_start + i * spacing
            log.record_watch(name, op, (f"k{i % 3}",), None, now[0], now[0] + 0.5)
            outcome = OUTCOMES[i % len(OUTCOMES)]
            now[0] += 0.5 if outcome == "expired" else 0.1
            log.record_end(name, op, outcome, now[0])  # type: ignore[arg-type]
        log.close()


def pytest_monkeypatch() -> contextlib.AbstractContextManager[Any]:
    import pytest

    return pytest.MonkeyPatch.context()


#: The follow job's settings in the tests: windows of 2 s, written once 4 s behind the newest.
WINDOW, WATERMARK = 2.0, 4.0


def follow_logs(directory: Path, part: int) -> None:
    """Part `part` (0, 1, 2) of the logs the follow tests publish: two purgatories, JSON Lines
    and Arrow, 10 s of operations from ``BASE_UTC + 9 * part`` (each part's windows overlap
    the previous part's last ones, which a job keeps open across a restart)."""
    start = BASE_UTC + 9 * part
    record_at(directory, "fetch", start, 40)
    record_at(directory, "produce", start + 0.1, 40, recorder=ArrowEventLog, spacing=0.24)


def follow_command(log: Path, out: Path, checkpoint: Path, *more: str) -> list[str]:
    return [
        *("analyze", "--follow", "--log", str(log), "--out", str(out)),
        *("--checkpoint", str(checkpoint), "--window", str(WINDOW)),
        *("--watermark", str(WATERMARK), "--interval", "1"),
        *more,
    ]


def written_windows(spark: SparkSession, out: Path) -> DataFrame:
    """Every window the follow job wrote (any Parquet reader sees the same files)."""
    return spark.read.parquet(str(out / "windows"))


def expected_windows(spark: SparkSession, log: Path, work: Path) -> DataFrame:
    """The windows a follow job must have written once it has read every file of `log`: those
    of a batch ``analyze`` of the same files that the watermark has passed (the newest window
    read starts `WATERMARK` seconds or more after them)."""
    from pyspark.sql import functions as F

    from purgatory.pipeline import analyze

    analyze(spark, str(log), str(work / "batch"), window=WINDOW, overwrite=True)
    batch = spark.read.parquet(str(work / "batch" / "windows"))
    newest = batch.agg(F.max("window_start")).first()
    assert newest is not None
    return batch.where(F.col("window_start") <= newest[0] - WATERMARK)


def follow_killed_and_restarted(
    spark: SparkSession, where: Sequence[str], work: Path, *, env: dict[str, str] | None = None
) -> None:
    """``analyze --follow`` on `where` (``--master ...`` or ``--remote ...``), killed (SIGKILL)
    while it runs with more files coming, then started again with ``--once``: what it wrote is
    exactly what a batch ``analyze`` of the same files gives (no window twice, none lost), and
    nothing was late. `spark` is the tests' local session, which computes the expectation."""
    from pyspark.testing import assertDataFrameEqual, assertSchemaEqual

    log, out, checkpoint = work / "events", work / "live", work / "checkpoint"
    follow_logs(log, 0)
    said = work / "follow.out"
    with said.open("w") as stdout:
        command = follow_command(log, out, checkpoint, *where)
        job = subprocess.Popen(
            [sys.executable, "-m", "purgatory.pipeline", *command],
            cwd=work,
            env=spark_env() if env is None else env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            until(lambda: any((out / "windows").glob("batch-*.parquet")), job, said)
            # More files: the next micro-batch (a second at most) reads them, and is killed
            # while it runs, or just after; either way they are read once, here or after.
            follow_logs(log, 1)
            time.sleep(1.5)
        finally:
            os.killpg(job.pid, signal.SIGKILL)  # the driver (and a local JVM) killed at once
            job.wait(timeout=60)
    before = said.read_text()
    assert "late" not in before, before
    follow_logs(log, 2)
    again = pipeline(*follow_command(log, out, checkpoint, "--once", *where), cwd=work, env=env)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert "late" not in again.stdout, again.stdout
    assert again.stderr == "", again.stderr
    # What the batches read, printed by one run or the other (on Spark Connect too, whose
    # progress reports come in another form: `progress_of`).
    printed = before + again.stdout
    assert re.search(r"^batch \d+: [1-9][\d,]* operations read", printed, re.M), printed
    written = written_windows(spark, out)
    expected = expected_windows(spark, log, work)
    assertSchemaEqual(written.schema, expected.schema)
    assertDataFrameEqual(written, expected, rtol=0, atol=0)
    assert written.count() > 10
    # Each operation of OUTCOMES' sixth kind was drained: an outcome of its own, counted.
    summary = spark.read.parquet(str(work / "batch" / "summary"))
    assert summary.groupBy().sum("drained", "operations").first() == (36, 240)


def until(done: Any, job: subprocess.Popen[bytes], said: Path, seconds: float = 240) -> None:
    """Wait until `done()`; fail with the job's output if it ends first or time runs out."""
    deadline = time.monotonic() + seconds
    while not done():
        if job.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"follow job: {said.read_text()[-3000:]}")
        time.sleep(0.2)


# -- what a process tree listens on --------------------------------------------------------------


def process_tree(root: int) -> list[int]:
    """`root` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def listening(root: int) -> list[tuple[str, int]]:
    """The TCP sockets `root`'s process tree listens on, as (address, port): its sockets'
    inodes (/proc/PID/fd) looked up in /proc/net/tcp and tcp6 (psutil is not a dependency)."""
    inodes: set[int] = set()
    for pid in process_tree(root):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(int(target[8:-1]))
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for row in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] != "0A" or int(fields[9]) not in inodes:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)  # 32-bit words in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.append((socket.inet_ntop(family, raw), int(port, 16)))
    return found


def loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("::1", "::ffff:127.0.0.1")


def environment(pid: int) -> dict[str, str]:
    """The environment process `pid` started with (/proc/PID/environ)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}
