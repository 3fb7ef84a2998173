"""Where a cluster replay's seconds go: its Spark jobs on a timeline.

``python -m benchmarks.job_timeline --operations 1000000 --workers 2 [--shards 2]``

A replay's wall time on a cluster is its tasks' replay plus a cost paid once per job (the
driver's planning, each Spark job's scheduling and the executors' first work), and that fixed
part is what keeps two workers from being twice as fast as one on a short trace. The groups
spread benchmark (`benchmarks.pipeline_spread`) gives the totals; this prints the parts: every
Spark job of one `replay()` on the standalone cluster of the tests (a master and one-core
workers on loopback), in seconds after the session was up, read from the driver's web UI (its
REST API), beside what the replay's tasks and phases report of themselves. It is how the job
timeline in `PIPELINE_RESULTS.md` ("A cluster job's fixed cost") was taken; one run, no figure
written anywhere, so run it on a quiet machine and read it with the load it prints.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from .environment import load_average
from .pipeline import ROOT
from .pipeline_spread import _executors_up, _standalone


def timestamp(text: str) -> float:
    """Seconds since the epoch of a time as Spark's REST API writes it
    (``2026-11-29T07:36:51.123GMT``)."""
    moment = datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
    return moment.timestamp()


def job_lines(jobs: Sequence[dict[str, Any]], start: float) -> list[str]:
    """One line per job, in submission order: when it was submitted and completed (seconds
    after `start`), how long it took, its stages and the call site Spark names it by."""
    lines = []
    for job in sorted(jobs, key=lambda j: j["jobId"]):
        submitted = timestamp(job["submissionTime"]) - start
        if "completionTime" in job:
            completed = timestamp(job["completionTime"]) - start
            took = f"{completed:7.2f} ({completed - submitted:5.2f} s)"
        else:
            took = "    not completed"
        lines.append(
            f"job {job['jobId']:3d} {submitted:7.2f} -> {took} stages {job['stageIds']} "
            f"{job['name'][:90]}"
        )
    return lines


def task_lines(stage: int, tasks: Sequence[dict[str, Any]], start: float) -> list[str]:
    """One line per task of `stage`, by launch: when it was launched (seconds after `start`),
    its executor, and where its seconds went as its executor counts them: deserialising the
    task, running it (of which the JVM's CPU and garbage collection), serialising its result,
    its result's size, the driver's fetch of a large result (``gettingResultTime``) and the
    scheduler's delay (what is left of its duration)."""
    lines = []
    for task in sorted(tasks, key=lambda t: (t["launchTime"], t["taskId"])):
        launched = timestamp(task["launchTime"]) - start
        m = task.get("taskMetrics", {})
        lines.append(
            f"stage {stage} task {task['index']} executor {task['executorId']}: "
            f"launched {launched:6.2f}, {task.get('duration', 0) / 1e3:5.2f} s: "
            f"deserialise {m.get('executorDeserializeTime', 0) / 1e3:.2f}, "
            f"run {m.get('executorRunTime', 0) / 1e3:.2f} "
            f"(JVM CPU {m.get('executorCpuTime', 0) / 1e9:.2f}, "
            f"GC {m.get('jvmGcTime', 0) / 1e3:.2f}), "
            f"result {m.get('resultSize', 0) / 1e6:.1f} MB "
            f"(serialise {m.get('resultSerializationTime', 0) / 1e3:.2f}, "
            f"fetch {task.get('gettingResultTime', 0) / 1e3:.2f}), "
            f"scheduler {task.get('schedulerDelay', 0) / 1e3:.2f}"
        )
    return lines


def _get(base: str, path: str) -> Any:
    with urllib.request.urlopen(base + path, timeout=30) as response:
        return json.load(response)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.job_timeline")
    parser.add_argument("--operations", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2, help="one-core standalone workers")
    parser.add_argument(
        "--shards", type=int, default=1, help="time shards of one purgatory (1: 8 purgatories)"
    )
    parser.add_argument("--work", default=None, help="directory for the trace (default: temp)")
    parser.add_argument(
        "--executor-memory",
        default="768m",
        help="spark.executor.memory, up to 4g (a split's task of 20 M operations wants 1g)",
    )
    args = parser.parse_args(argv)

    from purgatory.pipeline import W1, ReplayConfig, generate, get_session, replay

    work = Path(args.work or tempfile.mkdtemp(prefix="job-timeline-"))
    purgatories = 1 if args.shards > 1 else 8
    trace = work / f"trace-{args.operations}-{purgatories}"
    if not trace.exists():
        spark = get_session("local[2]", "job-timeline-trace", {"spark.driver.memory": "2g"})
        workload = W1(purgatories=purgatories, operations=args.operations // purgatories)
        generate(spark, workload, str(trace), overwrite=True)
        spark.stop()
    print(f"load average {load_average()} before", flush=True)
    with _standalone(work / "cluster", args.workers) as (url, _):
        conf = {
            "spark.driver.memory": "2g",
            "spark.executor.memory": args.executor_memory,
            "spark.executorEnv.PYTHONPATH": str(ROOT),
            "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        }
        spark = get_session(url, "job-timeline", conf, ui=True)
        _executors_up(spark, args.workers)
        start = time.time()
        reported: list[Any] = []
        phases: list[Any] = []
        summary = replay(
            spark,
            str(trace),
            str(work / "out"),
            [ReplayConfig()],
            overwrite=True,
            operations=False,
            read="direct",
            tasks=reported.extend,
            shards=args.shards,
            phases=phases.extend,
        )
        returned = time.time()
        operations = sum(row["operations"] for row in summary.collect())
        collected = time.time()
        context = spark.sparkContext
        base = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}"
        time.sleep(2)  # the status store follows the listener bus
        print(
            f"replay() {returned - start:.1f} s; the summary's collect "
            f"{collected - returned:.1f} s; {operations:,} operations"
        )
        print("\n".join(job_lines(_get(base, "/jobs"), start)))
        for stage in sorted(_get(base, "/stages"), key=lambda s: s["stageId"]):
            tasks = _get(base, f"/stages/{stage['stageId']}/{stage['attemptId']}/taskList")
            print("\n".join(task_lines(stage["stageId"], tasks, start)))
        for line in (*reported, *phases):
            print(" ", line.describe())
        spark.stop()
    print(f"load average {load_average()} after")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
