"""Independent groups spread over executors: where a replay's time goes, task by task.

``python -m benchmarks.pipeline_spread [--operations 3000000] [--purgatories 8] [--cluster]
[--repetitions 1] [--write]`` (the ``spark`` extra and Java 17). One seeded W1 trace (that of
``benchmarks.pipeline``, smaller) is replayed under one configuration, summary only, each run a
fresh driver process, alternated:

- ``local[1]`` and ``local[2]`` with the groups balanced over the tasks, each task reading its
  groups' rows from the trace's files itself (the job's default, ``read="direct"``), then the
  same with Spark reading, checking, shuffling and sorting the rows (``read="spark"``, the job
  before); with ``--hash``, also ``local[2]`` with the groups hash-partitioned into Spark's
  shuffle partitions (the earlier job, ``replay(..., balance=False)``);
- with ``--cluster``: a standalone master on loopback with one, then two one-core workers (as
  ``tests/test_pipeline_clusters.py`` starts them), both reads;
- with ``--shards N`` instead: one purgatory, unsplit on ``local[1]`` and split into N time
  shards on ``local[2]``, both with the direct read (the unsplit job's best), at each
  ``--purge-interval``; the split job's driver also says where its time went (`Phase`:
  reading and checking the columns, planning, the Spark job, merging, writing); with
  ``--cluster`` too, the same unsplit on a standalone cluster of one one-core worker and split
  on one of two (``--no-local``: those only; ``--local-from JSON`` then takes the local runs
  from an earlier ``--json`` for the section ``--write`` gives).

Per run: the job's wall seconds (on a cluster, from the moment its executors have
registered: their JVMs' start is the cluster's, as the local session's JVM is up before a
local run's clock starts; the seconds waited are in the JSON, ``executors_seconds``); the CPU
seconds of its processes (``/proc``: the driver's Python, the JVM, Spark's Python workers; on
the cluster, each worker's tree: its executor JVMs; the executors' Python workers are not found
there once the run has ended, 24.9 CPU seconds for tasks of 120 in one run, so their tasks'
own CPU seconds are the tasks' column); the JVM's own view from
the web UI's REST API (this benchmark's sessions only turn the UI on): per stage, tasks, run
time and the task threads' CPU; and each replay task's report
(`purgatory.pipeline._job_replay.ReplayTask`): its groups, operations, its Python worker's wall
and CPU seconds, of which reading its input batches. ``--write`` puts the section in
PIPELINE_RESULTS.md between its markers (the other sections kept). The machine is shared: the
load average is taken before and after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from .environment import describe_environment, load_average
from .pipeline import RESULTS, ROOT, _tree_cpu_seconds, write_section

BEGIN = "<!-- groups spread: written by `python -m benchmarks.pipeline_spread --write` -->"
END = "<!-- groups spread: end -->"
SHARDS_BEGIN = (
    "<!-- time shards: written by `python -m benchmarks.pipeline_spread --shards N --write` -->"
)
SHARDS_END = "<!-- time shards: end -->"


def _process_cpu(root: int) -> dict[str, float]:
    """CPU seconds so far of `root`'s tree by kind: ``driver`` (root itself), ``jvm`` (java
    processes), ``python workers`` (everything else, exited children included via their
    parents' cutime); Linux ``/proc``."""
    tick = os.sysconf("SC_CLK_TCK")
    info: dict[int, tuple[int, str, list[int]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                text = file.read()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        info[int(entry)] = (int(fields[1]), name, [int(x) for x in fields[11:15]])
    found = {"driver": 0.0, "jvm": 0.0, "python workers": 0.0}
    for pid, (_, name, (utime, stime, cutime, cstime)) in info.items():
        ancestor = pid
        while ancestor not in (0, 1, root) and ancestor in info:
            ancestor = info[ancestor][0]
        if ancestor != root:
            continue
        if pid == root:
            found["driver"] += (utime + stime) / tick
        elif name == "java":  # its cutime would count the Python daemon once it is reaped
            found["jvm"] += (utime + stime) / tick
        else:
            found["python workers"] += (utime + stime + cutime + cstime) / tick
    return found


def _stages(spark: Any) -> list[dict[str, Any]]:
    """The finished stages of this application, from the web UI's REST API (this process's
    session has the UI on), with the replay stage's tasks."""
    sc = spark.sparkContext
    base = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}"

    def get(path: str) -> Any:
        with urllib.request.urlopen(base + path, timeout=30) as response:
            return json.load(response)

    for _ in range(50):  # the status store follows the listener bus: wait for every stage
        stages = get("/stages")
        if stages and all(s["status"] in ("COMPLETE", "SKIPPED", "FAILED") for s in stages):
            break
        time.sleep(0.2)
    found = []
    for stage in sorted(stages, key=lambda s: s["stageId"]):
        if stage["status"] != "COMPLETE":
            continue
        row = {
            "stage": stage["stageId"],
            "tasks": stage["numTasks"],
            "run_seconds": stage["executorRunTime"] / 1e3,
            "cpu_seconds": stage["executorCpuTime"] / 1e9,
            "input_mb": stage["inputBytes"] / 1e6,
            "shuffle_read_mb": stage["shuffleReadBytes"] / 1e6,
            "shuffle_write_mb": stage["shuffleWriteBytes"] / 1e6,
            "gc_seconds": stage["jvmGcTime"] / 1e3,
            "spilled_mb": stage["memoryBytesSpilled"] / 1e6,
            "disk_spilled_mb": stage["diskBytesSpilled"] / 1e6,
            "task_seconds": [],
        }
        if row["run_seconds"] > 1.0:  # the tasks of the stages that matter
            tasks = get(f"/stages/{stage['stageId']}/{stage['attemptId']}/taskList?length=500")
            row["task_seconds"] = sorted(
                (t["taskMetrics"]["executorRunTime"] / 1e3 for t in tasks if "taskMetrics" in t),
                reverse=True,
            )
        found.append(row)
    return found


#: The child's environment variable: how many executors its cluster starts (0: local).
_WORKERS = "PURGATORY_SPREAD_WORKERS"
#: The cluster's executor memory, from `--executor-memory` (the child's environment).
_EXECUTOR_MEMORY = "PURGATORY_SPREAD_EXECUTOR_MEMORY"


def _executors_up(spark: Any, workers: int, seconds: float = 180.0) -> float:
    """Wait until `workers` executors have registered with the driver (a cluster's session
    returns before its executors have started: their JVMs' start is the cluster's, as the
    local session's JVM is up before a local run's clock starts); return the seconds waited."""
    started = time.perf_counter()
    context = spark.sparkContext._jsc.sc()
    while workers and context.getExecutorMemoryStatus().size() - 1 < workers:  # (the driver's)
        if time.perf_counter() - started > seconds:
            raise SystemExit(f"{workers} executors did not register in {seconds:.0f} s")
        time.sleep(0.1)
    return time.perf_counter() - started


def _child(trace: str, out: str, master: str, partitioning: str) -> dict[str, Any]:
    """In a fresh process: one summary-only replay; wall, CPU by process, stages, tasks.

    `partitioning`: ``direct`` (balanced, the direct read), ``spark`` (balanced, Spark's read)
    or ``hash`` (hash-partitioned, Spark's read), or ``shards:N:P`` (each group in N time
    shards, purge interval P; N = 1: unsplit; the direct read either way).
    """
    from purgatory.pipeline import ReplayConfig, get_session, replay

    conf = {"spark.driver.memory": "2g"}
    if master.startswith("spark://"):
        conf |= {
            "spark.executor.memory": os.environ.get(_EXECUTOR_MEMORY, "768m"),
            "spark.executorEnv.PYTHONPATH": str(ROOT),
            "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        }
    spark = get_session(master, f"purgatory-spread-{partitioning}", conf, ui=True)
    executors = _executors_up(spark, int(os.environ.get(_WORKERS, "0")))
    cpu = _process_cpu(os.getpid())
    reported: list[Any] = []
    boundaries: list[Any] = []
    phases: list[Any] = []
    config, shards = ReplayConfig(), 1
    read: Literal["direct", "spark"] = "direct" if partitioning == "direct" else "spark"
    if partitioning.startswith("shards:"):
        # Unsplit or split, the direct read: the best a user has either way.
        _, count, interval = partitioning.split(":")
        config, shards, read = ReplayConfig(purge_interval=int(interval)), int(count), "direct"
    started = time.perf_counter()
    summary = replay(
        spark,
        trace,
        out,
        [config],
        overwrite=True,
        operations=False,
        balance=partitioning != "hash",
        read=read,
        tasks=reported.extend,
        shards=shards,
        boundaries=boundaries.extend,
        phases=phases.extend,
    )
    operations = sum(row["operations"] for row in summary.collect())
    seconds = time.perf_counter() - started
    after = _process_cpu(os.getpid())
    stages = _stages(spark)
    spark.stop()
    return {
        "master": master,
        "partitioning": partitioning,
        "seconds": seconds,
        "executors_seconds": executors,
        "operations": operations,
        "cpu": {kind: after[kind] - cpu[kind] for kind in after},
        "stages": stages,
        "boundaries": [b.describe() for b in boundaries],
        "phases": [
            {"name": p.name, "seconds": p.seconds, "cpu_seconds": p.cpu_seconds} for p in phases
        ],
        "tasks": [
            {
                "partition": t.partition,
                "pid": t.pid,
                "groups": list(t.groups),
                "operations": t.operations,
                "seconds": t.seconds,
                "cpu_seconds": t.cpu_seconds,
                "input_seconds": t.input_seconds,
                "input_cpu_seconds": t.input_cpu_seconds,
            }
            for t in reported
        ],
    }


def _run(
    trace: str, out: str, master: str, partitioning: str, *, label: str, workers: list[int]
) -> dict[str, Any]:
    """One child run, with the load average before and after and the workers' CPU seconds."""
    load = load_average()
    worker_cpu = [_tree_cpu_seconds(pid) for pid in workers]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    env[_WORKERS] = str(len(workers))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.pipeline_spread",
            "--child",
            trace,
            out,
            master,
            partitioning,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"{label} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    run: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    run["label"] = label
    run["load_before"], run["load_after"] = load, load_average()
    if workers:
        run["cpu"]["cluster workers (executor JVMs)"] = sum(
            _tree_cpu_seconds(pid) - before for pid, before in zip(workers, worker_cpu, strict=True)
        )
    print(
        f"{label}: {run['seconds']:.1f} s, CPU "
        + ", ".join(f"{k} {v:.1f}" for k, v in run["cpu"].items())
        + f" (load {load} -> {run['load_after']})"
        + (f"; executors up {run['executors_seconds']:.1f} s before" if workers else ""),
        flush=True,
    )
    if run["phases"]:
        print(
            "  driver: "
            + ", ".join(
                f"{p['name']} {p['seconds']:.1f} s ({p['cpu_seconds']:.1f} CPU)"
                for p in run["phases"]
            ),
            flush=True,
        )
    for task in run["tasks"]:
        print(
            f"  partition {task['partition']}: {len(task['groups'])} groups "
            f"{task['operations']:,} ops, {task['seconds']:.1f} s wall, "
            f"{task['cpu_seconds']:.1f} s CPU, input {task['input_seconds']:.1f} s",
            flush=True,
        )
    return run


@contextmanager
def _standalone(work: Path, workers: int) -> Iterator[tuple[str, list[int]]]:
    """A standalone master and `workers` one-core workers on loopback (as the tests' cluster);
    yields the master's URL and the workers' process ids."""
    import socket

    from pyspark.find_spark_home import _find_spark_home

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    spark_class = str(Path(_find_spark_home()) / "bin" / "spark-class")
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    }
    url = f"spark://127.0.0.1:{port()}"
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    work.mkdir(parents=True, exist_ok=True)

    def start(name: str, args: list[str], ready: str) -> subprocess.Popen[bytes]:
        log = work / f"{name}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [spark_class, *args], stdout=out, stderr=subprocess.STDOUT, env=env
            )
        started.append((process, log))
        deadline = time.monotonic() + 180
        while ready not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        return process

    try:
        host, master_port = "127.0.0.1", url.rsplit(":", 1)[1]
        start(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                host,
                "--port",
                master_port,
                "--webui-port",
                str(port()),
            ],
            "I have been elected leader",
        )
        pids = []
        for i in range(1, workers + 1):
            worker = start(
                f"worker-{i}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    host,
                    "--cores",
                    "1",
                    "--memory",
                    "4g",  # (what executors it may start: up to --executor-memory 4g)
                    "--webui-port",
                    str(port()),
                    "--work-dir",
                    str(work / f"worker-{i}"),
                    url,
                ],
                "Successfully registered with master",
            )
            pids.append(worker.pid)
        yield url, pids
    finally:
        for process, _ in reversed(started):
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Generate the trace; the local runs, alternated; the cluster runs (``--cluster``).

    With ``--shards N``: one purgatory, unsplit on ``local[1]`` and in N time shards on
    ``local[2]`` (purge interval ``--purge-interval``), both the direct read, alternated.
    """
    from purgatory.pipeline import W1, generate, get_session

    env = describe_environment()
    trace = str(work / "trace")
    purgatories = 1 if args.shards else args.purgatories
    w1 = W1(purgatories=purgatories, operations=args.operations // purgatories, chunk=250_000)
    spark = get_session("local[2]", "purgatory-spread-generate", {"spark.driver.memory": "2g"})
    generate(spark, w1, trace, overwrite=True)
    spark.stop()
    runs = []
    local = [
        ("local[1]", "direct", "local[1], direct read"),
        ("local[2]", "direct", "local[2], direct read"),
        ("local[1]", "spark", "local[1], Spark read (before)"),
        ("local[2]", "spark", "local[2], Spark read (before)"),
    ]
    if args.hash:
        local.append(("local[2]", "hash", "local[2], hash-partitioned, Spark read (earlier)"))
    if args.shards:
        local = []
        for interval in args.purge_interval:
            local += [
                (
                    "local[1]",
                    f"shards:1:{interval}",
                    f"purge interval {interval}: local[1], unsplit (direct read)",
                ),
                (
                    "local[2]",
                    f"shards:{args.shards}:{interval}",
                    f"purge interval {interval}: local[2], {args.shards} time shards",
                ),
            ]
    for _ in range(args.repetitions if args.local else 0):
        for master, partitioning, label in local:
            runs.append(
                _run(trace, str(work / "out"), master, partitioning, label=label, workers=[])
            )
    if args.cluster and args.shards:
        for workers in (1, 2):
            with _standalone(work / f"cluster-{workers}", workers) as (url, pids):
                for _ in range(args.repetitions):
                    for interval in args.purge_interval:
                        count = 1 if workers == 1 else args.shards
                        runs.append(
                            _run(
                                trace,
                                str(work / "out"),
                                url,
                                f"shards:{count}:{interval}",
                                label=_shards_label(interval, workers, args.shards),
                                workers=pids,
                            )
                        )
    elif args.cluster:
        for workers in (1, 2):
            with _standalone(work / f"cluster-{workers}", workers) as (url, pids):
                for _ in range(args.repetitions):
                    for read, said in (("direct", "direct read"), ("spark", "Spark read")):
                        label = (
                            f"standalone, {workers} one-core worker{'s' if workers > 1 else ''}, "
                            f"{said}"
                        )
                        runs.append(
                            _run(trace, str(work / "out"), url, read, label=label, workers=pids)
                        )
    return {
        "environment": env,
        "operations": w1.purgatories * w1.operations,
        "purgatories": w1.purgatories,
        "shards": args.shards,
        "purge_interval": args.purge_interval,
        "cluster": bool(args.cluster),
        "runs": runs,
    }


def _shards_label(interval: int, workers: int, shards: int) -> str:
    """A ``--shards --cluster`` run's label: the unsplit job on one worker, the split one on
    two (as the local runs: local[1] unsplit, local[2] split)."""
    if workers == 1:
        return f"purge interval {interval}: standalone, 1 one-core worker, unsplit (direct read)"
    return (
        f"purge interval {interval}: standalone, {workers} one-core workers, {shards} time shards"
    )


def render(f: dict[str, Any]) -> str:
    """The Markdown section of a run."""
    env = f["environment"]
    by_label: dict[str, list[dict[str, Any]]] = {}
    for run in f["runs"]:
        by_label.setdefault(run["label"], []).append(run)

    def best(label: str) -> float:
        return float(min(run["seconds"] for run in by_label[label]))

    lines = [
        BEGIN,
        "## Groups spread over executors",
        "",
        f"`python -m benchmarks.pipeline_spread --cluster --operations {f['operations']} "
        "--write` (see its docstring): a W1 trace of "
        f"**{f['operations']:,} operations** over {f['purgatories']} purgatories "
        f"({f['purgatories']} independent groups under one configuration), summary only, each "
        "run a driver process of its own, alternated (on the cluster, timed from the moment its "
        "executors have registered, as a local run from its session's start). The direct read: "
        "each task reads its "
        "groups' rows from the trace's Parquet files itself (the default); Spark read: the JVM "
        "reads, checks, shuffles and sorts them (the job before). CPU seconds from `/proc` (a "
        "cluster worker's: its executor JVMs, without their Python workers, whose tasks' CPU "
        "is the tasks' column); the "
        "JVM's stages from the web UI's REST API (task run time and the task threads' CPU); per "
        "task, the replay's own report (its Python worker's wall and CPU seconds, of which "
        "reading its input: from Parquet, checked and sorted, or the JVM's batches).",
        "",
        f"- {env['date']}; Python {env['python']}, {env['cpu_model']}, {env['cpu_count']} CPUs "
        "(shared: the load average before and after each run, its own Spark processes included, "
        f"is in the table); {env['git']}.",
        "",
        "| run | wall s | CPU s: driver / JVM / Python workers (/ cluster workers) | tasks: "
        "groups, operations, Python wall s (CPU s; input wall s) | load before -> after |",
        "|---|---:|---|---|---|",
    ]
    for run in f["runs"]:
        cpu = " / ".join(f"{v:.1f}" for v in run["cpu"].values())
        tasks = "; ".join(
            f"p{t['partition']}: {len(t['groups'])}, {t['operations']:,}, {t['seconds']:.1f} "
            f"({t['cpu_seconds']:.1f}; {t['input_seconds']:.1f})"
            for t in run["tasks"]
        )
        lines.append(
            f"| {run['label']} | {run['seconds']:.1f} | {cpu} | {tasks} | "
            f"{run['load_before']} -> {run['load_after']} |"
        )
    lines += ["", "Speed-ups (the fastest run of each):", ""]
    pairs = [
        ("local[2], direct read", "local[1], direct read", "local[1] -> local[2], direct read"),
        (
            "local[2], Spark read (before)",
            "local[1], Spark read (before)",
            "local[1] -> local[2], Spark read (before)",
        ),
        (
            "local[2], hash-partitioned, Spark read (earlier)",
            "local[1], Spark read (before)",
            "local[1] -> local[2], hash-partitioned, Spark read",
        ),
        (
            "standalone, 2 one-core workers, direct read",
            "standalone, 1 one-core worker, direct read",
            "standalone, 1 -> 2 workers, direct read",
        ),
        (
            "standalone, 2 one-core workers, Spark read",
            "standalone, 1 one-core worker, Spark read",
            "standalone, 1 -> 2 workers, Spark read (before)",
        ),
        (
            "local[1], direct read",
            "local[1], Spark read (before)",
            "local[1], Spark read -> direct read",
        ),
        (
            "local[2], direct read",
            "local[2], Spark read (before)",
            "local[2], Spark read -> direct read",
        ),
    ]
    for fast, slow, name in pairs:
        if fast in by_label and slow in by_label:
            lines.append(f"- {name}: **{best(slow) / best(fast):.2f}x**")
    lines += [
        "",
        "The JVM's stages of each run, those of 0.5 s or more (stage: tasks, run s, task "
        "threads' CPU s, GC s, shuffle read MB, spilled MB in memory / on disk, the longest "
        "tasks' run s):",
        "",
    ]
    for run in f["runs"]:
        stages = "; ".join(
            f"{s['stage']}: {s['tasks']}, {s['run_seconds']:.1f}, {s['cpu_seconds']:.1f}, "
            f"{s['gc_seconds']:.1f}, {s['shuffle_read_mb']:.0f}, "
            f"{s['spilled_mb']:.0f} / {s['disk_spilled_mb']:.0f}"
            + (
                f", [{', '.join(f'{x:.1f}' for x in s['task_seconds'][:4])}]"
                if s["task_seconds"]
                else ""
            )
            for s in run["stages"]
            if s["run_seconds"] >= 0.5
        )
        lines.append(f"- {run['label']}: {stages}")
    return "\n".join([*lines, "", END, ""])


def render_shards(f: dict[str, Any]) -> str:
    """The Markdown section of a ``--shards`` run."""
    env = f["environment"]
    cluster = f.get("cluster", False)
    by_label: dict[str, list[dict[str, Any]]] = {}
    for run in f["runs"]:
        by_label.setdefault(run["label"], []).append(run)
    lines = [
        SHARDS_BEGIN,
        "## One group split by time",
        "",
        f"`python -m benchmarks.pipeline_spread --shards {f['shards']} --purge-interval "
        f"{' '.join(map(str, f['purge_interval']))} --operations {f['operations']}"
        f"{' --cluster' if cluster else ''} --write`: one "
        f"W1 purgatory of **{f['operations']:,} operations** under one configuration per purge "
        f"interval, summary only, unsplit on `local[1]` and in {f['shards']} time shards on "
        "`local[2]`"
        + (
            " (and unsplit on a standalone cluster of one one-core worker on loopback, in "
            f"{f['shards']} time shards on one of two: as the tests' cluster)"
            if cluster
            else ""
        )
        + ", each run a driver process of its own, alternated"
        + (
            " (on the cluster, timed from the moment its executors have registered)"
            if cluster
            else ""
        )
        + ". Both read the trace "
        "directly (the default): the unsplit job is the groups job's direct read, its one task "
        "reading the purgatory's rows from the Parquet files itself, the best a user has "
        "without the split; the split job's driver reads the columns it plans from and its "
        "tasks read their shards' rows. Purge interval 0 purges "
        "at every pass (the warm-ups rebuild the state); Kafka's 1000 counts over the whole "
        "history, and the driver carries that count into each shard (the unsplit replay's "
        "purges foreseen from the trace and re-enacted by the warm-ups): every boundary should "
        "match at both.",
        "",
        f"- {env['date']}; Python {env['python']}, {env['cpu_model']}, {env['cpu_count']} CPUs "
        "(shared: the load average before and after each run, its own Spark processes included, "
        f"is in the table); {env['git']}.",
        "",
        "| run | wall s | CPU s: driver / JVM / Python workers"
        + (" (/ cluster workers)" if cluster else "")
        + " | tasks: shards, operations "
        "replayed (warm-ups included), Python wall s (CPU s) | the driver's phases: wall s "
        "(its CPU s) | boundaries matched | load before -> after |",
        "|---|---:|---|---|---|---|---|",
    ]
    for run in f["runs"]:
        cpu = " / ".join(f"{v:.1f}" for v in run["cpu"].values())
        tasks = "; ".join(
            f"p{t['partition']}: {len(t['groups'])}, {t['operations']:,}, {t['seconds']:.1f} "
            f"({t['cpu_seconds']:.1f})"
            for t in run["tasks"]
        )
        said = run.get("boundaries", [])
        matched = sum("matched" in line for line in said)
        phases = ", ".join(
            f"{p['name']} {p['seconds']:.1f} ({p['cpu_seconds']:.1f})"
            for p in run.get("phases", [])
        )
        lines.append(
            f"| {run['label']} | {run['seconds']:.1f} | {cpu} | {tasks} | {phases or '-'} | "
            f"{matched} of {len(said)} | {run['load_before']} -> {run['load_after']} |"
        )
    lines += [
        "",
        "Speed-ups, unsplit on local[1] -> split on local[2]"
        + (", and unsplit on one standalone worker -> split on two" if cluster else "")
        + " (the fastest run of each):",
        "",
    ]
    for interval in f["purge_interval"]:
        for where, unsplit, split in (
            ("", "local[1], unsplit", "local[2], "),
            (", standalone 1 -> 2 workers", "standalone, 1 one-core", "standalone, 2 one-core"),
        ):
            mine = [
                [label for label in by_label if label.startswith(f"purge interval {interval}: {s}")]
                for s in (unsplit, split)
            ]
            if all(len(found) == 1 for found in mine):
                slow, fast = (min(r["seconds"] for r in by_label[found[0]]) for found in mine)
                lines.append(f"- purge interval {interval}{where}: **{slow / fast:.2f}x** (wall)")
    return "\n".join([*lines, "", SHARDS_END, ""])


def with_local_runs(figures: dict[str, Any], earlier: dict[str, Any]) -> dict[str, Any]:
    """`figures` with the local runs (``local[N]`` masters) of an `earlier` run of the same
    benchmark before its own (the same options: the same trace), the dates and commits of both
    said where they differ."""
    for key in ("operations", "purgatories", "shards", "purge_interval"):
        if earlier.get(key) != figures.get(key):
            raise SystemExit(f"--local-from: {key} {earlier.get(key)!r}, not {figures.get(key)!r}")
    local = [r for r in earlier["runs"] if str(r.get("master", "")).startswith("local")]
    if not local:
        raise SystemExit("--local-from: no local run in that file")
    environment = dict(figures["environment"])
    for key in ("date", "git"):
        before, now = earlier["environment"][key], environment[key]
        environment[key] = now if before == now else f"{before} (local runs), {now} (cluster runs)"
    return {**figures, "environment": environment, "runs": [*local, *figures["runs"]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pipeline_spread")
    parser.add_argument("--operations", type=int, default=3_000_000)
    parser.add_argument("--purgatories", type=int, default=8)
    parser.add_argument("--repetitions", type=int, default=1)
    parser.add_argument("--cluster", action="store_true", help="also a standalone cluster")
    parser.add_argument(
        "--hash", action="store_true", help="also local[2] hash-partitioned (Spark's read)"
    )
    parser.add_argument("--no-local", dest="local", action="store_false", help="no local[N] runs")
    parser.add_argument("--work", default=None, help="directory for the trace (default: temp)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--write", action="store_true", help="write PIPELINE_RESULTS.md")
    parser.add_argument(
        "--shards",
        type=int,
        default=0,
        help="one purgatory instead: unsplit on local[1], in this many time shards on local[2]",
    )
    parser.add_argument(
        "--purge-interval",
        type=int,
        nargs="+",
        default=[0, 1000],
        help="with --shards: the configuration's purge intervals, a pair of runs each (0: purge "
        "at every pass, where a warm-up rebuilds the state; Kafka's 1000: the count carried)",
    )
    parser.add_argument(
        "--local-from",
        default=None,
        metavar="JSON",
        help="with --no-local: take the local runs from this earlier --json of the same "
        "benchmark (so that --write gives the whole section from the cluster runs alone)",
    )
    parser.add_argument(
        "--executor-memory",
        default="768m",
        help="the standalone cluster's spark.executor.memory, up to 4g (a split's task returns "
        "8 bytes per operation: tasks of 20 M operations ran 768m out of memory at times)",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child)))
        return 0
    os.environ[_EXECUTOR_MEMORY] = args.executor_memory  # (the children's)
    earlier = None
    if args.local_from:  # (checked before the runs: they take minutes)
        if args.local:
            parser.error("--local-from goes with --no-local")
        earlier = json.loads(Path(args.local_from).read_text())
        purgatories = 1 if args.shards else args.purgatories
        planned = {
            "operations": purgatories * (args.operations // purgatories),
            "purgatories": purgatories,
            "shards": args.shards,
            "purge_interval": args.purge_interval,
            "environment": {"date": "", "git": ""},
            "runs": [],
        }
        with_local_runs(planned, earlier)
    work = Path(args.work or tempfile.mkdtemp(prefix="purgatory-spread-"))
    figures = measure(args, work)
    if earlier is not None:
        figures = with_local_runs(figures, earlier)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    text = render_shards(figures) if args.shards else render(figures)
    print(text)
    if args.write:
        begin, end = (SHARDS_BEGIN, SHARDS_END) if args.shards else (BEGIN, END)
        write_section(RESULTS, text, begin, end)
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
