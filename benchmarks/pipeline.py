"""The data pipeline at scale: replay throughput on Spark and the event log's cost per operation.

``python -m benchmarks.pipeline [--operations 10000000] [--write]`` (needs the ``spark`` extra
and Java 17). ``--small`` measures small jobs instead (below). It measures, in one run:

1. **Replay on Spark**: a seeded W1 trace of ``--operations`` operations (``--purgatories``
   purgatories), replayed under one configuration by the ``replay`` job, summary only
   (``--summary-only``) on ``local[1]`` and on ``local[2]``, then writing every operation's row
   on ``local[1]``, each in a fresh driver process (one JVM per run). Reported: wall seconds of
   the whole job (validation, shuffle, replay, writing), operations per second and per core,
   the speed-up from one core to two, what the rows cost, and the CPU seconds the job's
   processes used (the driver, the JVM, Spark's Python workers: ``/proc``), which say how many
   cores a ``local[1]`` job really keeps busy (the JVM's threads run beside its one task).
2. **The engine alone**: the same replay engine in this process, no Spark, on the first
   ``--engine-operations`` operations of that trace's first purgatory: operations per second per
   core (per CPU second) and CPU microseconds per operation. Its ratio to the Spark figure per
   core is what Spark's Python exchange costs. ``--engine-only`` measures this alone, on the
   same operations generated in this process (numpy and pyarrow, no Spark, no Java): the trace
   generator seeds each purgatory's chunks independently, so they are the rows the Spark job
   would write; ``--engine-only TRACE`` reads them from a trace written before. The suite runs
   it as the ``pipeline-engine`` workload.
3. **The event log's overhead**: the engine with and without a `purgatory.JsonLinesEventLog`
   (writing to a temporary directory), alternated, ``--repetitions`` times each, medians; the
   difference per operation is the recorder's cost (record_watch + record_end + formatting and
   writing its line).

``python -m benchmarks.pipeline_spread`` measures how a replay's groups spread over the tasks
(local[1], local[2], a standalone cluster of one and two workers), task by task; ``--write``
keeps its section.

``--small [--write]``: what a user waits for a small job, Spark's start included: the command
line (``python -m purgatory.pipeline``, a process of its own, on ``local[2]``) running
``analyze`` of 1 MB of JSON Lines event logs and ``replay`` of a 20,000-operation trace,
``--repetitions`` times each, alternated, with the local driver's class archive (in a directory
of the run's own: a first ``analyze``, timed on its own, has it saved by a background process,
whose time is reported too and waited for) and without it; wall seconds from the process's
start to its exit, with the load average before each run. ``--write`` puts
the table in PIPELINE_RESULTS.md beside the throughput table (between the ``small jobs``
markers; a throughput run keeps it).

Absolute times on this shared 2-core machine drift with the other users' load (reported).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import Config
from .environment import describe_environment, load_average
from .eventlog import NullLog
from .measure import figure

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "PIPELINE_RESULTS.md"
#: Where a local driver keeps the archive of its classes, or ``off`` (docs/pipeline.md).
ARCHIVE_SETTING = "PURGATORY_SPARK_CLASS_ARCHIVE"


def _child_replay(trace: str, out: str, master: str, rows: str) -> dict[str, Any]:
    """In a fresh process: one replay job on `master`; its wall time and row count.

    `rows` is ``"summary"`` (``--summary-only``: each group's summary from its task) or
    ``"rows"`` (every operation's row written too).
    """
    from purgatory.pipeline import ReplayConfig, get_session, replay

    spark = get_session(master, "purgatory-bench", {"spark.driver.memory": "4g"})
    cpu = _tree_cpu_seconds(os.getpid())
    started = time.perf_counter()
    summary = replay(
        spark, trace, out, [ReplayConfig()], overwrite=True, operations=rows == "rows", tasks=None
    )
    groups = [row.asDict() for row in summary.collect()]
    seconds = time.perf_counter() - started
    cpu = _tree_cpu_seconds(os.getpid()) - cpu
    spark.stop()
    return {
        "master": master,
        "rows": rows,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "operations": sum(row["operations"] for row in groups),
        "expired": sum(row["expired"] for row in groups),
    }


def _tree_cpu_seconds(root: int) -> float:
    """CPU seconds used so far by process `root` and its descendants (the JVM, Spark's Python
    workers), the exited ones their parents waited for included (Linux ``/proc``)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the name: state, ppid, ... utime, stime, cutime, cstime are fields 14-17.
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(x) for x in fields[11:15]) / tick
    total = 0.0
    for pid, cpu in times.items():
        ancestor = pid
        while ancestor not in (0, 1, root) and ancestor in parents:
            ancestor = parents[ancestor]
        if ancestor == root:
            total += cpu
    return total


def _engine(trace: Any, log_dir: str | None, *, null: bool = False) -> float:
    """CPU seconds of one plain replay of `trace` (a pyarrow table)."""
    from purgatory.pipeline import ReplayConfig, _replay, replay_table

    real = _replay._group_log
    if null:
        setattr(_replay, "_group_log", lambda directory, prefix: NullLog())  # noqa: B010
    try:
        started = time.process_time()
        replay_table(trace, {0: ReplayConfig()}, event_log_dir=log_dir)
        return time.process_time() - started
    finally:
        setattr(_replay, "_group_log", real)  # noqa: B010


ENGINE_GOAL = 100_000.0
"""Operations per second per core the engine alone should replay."""


def engine_trace(operations: int, purgatories: int, engine_operations: int) -> Any:
    """The first `engine_operations` operations of purgatory ``p0000`` of the trace a full run
    generates (`operations` over `purgatories`, chunks of 250,000), made in this process: a
    pyarrow table, no Spark."""
    import pyarrow as pa

    from purgatory.pipeline import W1
    from purgatory.pipeline._generate import chunk_plan, generate_chunk

    w1 = W1(purgatories=purgatories, operations=operations // purgatories, chunk=250_000)
    batches = []
    rows = 0
    for chunk in chunk_plan(w1):
        if chunk[0] != 0 or rows >= engine_operations:
            continue
        batch = generate_chunk(w1, chunk)
        batches.append(batch)
        rows += batch.num_rows
    return pa.Table.from_batches(batches).slice(0, engine_operations)


def engine_figures(trace: Any, repetitions: int) -> dict[str, Any]:
    """The engine alone with no event log, a do-nothing one and `JsonLinesEventLog`, alternated;
    operations per second per core (the CPU seconds of one replay) with their spread."""
    _engine(trace.slice(0, 10_000), None)  # warm-up
    samples: dict[str, list[float]] = {"none": [], "null": [], "json": []}
    with tempfile.TemporaryDirectory() as logs:
        for i in range(repetitions):
            samples["none"].append(_engine(trace, None))
            samples["null"].append(_engine(trace, "unused", null=True))
            samples["json"].append(_engine(trace, f"{logs}/{i}"))
    n = trace.num_rows
    us = {name: statistics.median(values) / n * 1e6 for name, values in samples.items()}
    rates = sorted(n / seconds for seconds in samples["none"])
    return {
        "engine_operations": n,
        "engine_ops_per_core_s": statistics.median(rates),
        "engine_ops_per_core_s_min": rates[0],
        "engine_ops_per_core_s_max": rates[-1],
        "engine_us_per_op": us["none"],
        "engine_null_us_per_op": us["null"],
        "engine_logged_us_per_op": us["json"],
        "event_log_overhead_us_per_op": us["json"] - us["none"],
        "samples": samples,
    }


SMALL_BEGIN = "<!-- small jobs: written by `python -m benchmarks.pipeline --small --write` -->"
SMALL_END = "<!-- small jobs: end -->"
#: The small jobs' inputs: event logs of at least this many bytes, a trace of these operations.
SMALL_LOG_BYTES = 1_000_000
SMALL_OPERATIONS = 20_000


def small_inputs(work: Path) -> dict[str, Any]:
    """A directory of JSON Lines event logs of about 1 MB, and a 20,000-operation trace."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from purgatory.pipeline import W1, ReplayConfig, replay_table
    from purgatory.pipeline._generate import chunk_plan, generate_chunk

    def trace_of(w1: W1) -> Any:
        return pa.Table.from_batches([generate_chunk(w1, chunk) for chunk in chunk_plan(w1)])

    logs = work / "logs"
    operations = 1000
    while True:  # the replay's own event logs, grown until they weigh 1 MB
        shutil.rmtree(logs, ignore_errors=True)
        w1 = W1(purgatories=1, operations=operations, never=0.05)
        replay_table(trace_of(w1), {0: ReplayConfig()}, event_log_dir=str(logs), operations=False)
        size = sum(f.stat().st_size for f in logs.glob("*.jsonl"))
        if size >= SMALL_LOG_BYTES:
            break
        operations = int(operations * SMALL_LOG_BYTES / size) + 1
    (work / "trace").mkdir(exist_ok=True)
    w1 = W1(purgatories=4, operations=SMALL_OPERATIONS // 4)
    pq.write_table(trace_of(w1), work / "trace" / "part-0.parquet")
    return {"log_bytes": size, "log_operations": operations, "trace_operations": SMALL_OPERATIONS}


def small_jobs(repetitions: int, work: Path) -> dict[str, Any]:
    """Wall seconds of each small job, from its process's start to its exit, alternated: with
    the local driver's class archive (saved by a first job, timed on its own) and without."""
    inputs = small_inputs(work)
    jobs = {
        "analyze": ["analyze", "--log", "logs", "--out", "analysis"],
        "replay": ["replay", "--trace", "trace", "--out", "replay"],
    }
    archive = {ARCHIVE_SETTING: str(work / "class-archive")}
    without = {ARCHIVE_SETTING: "off"}
    runs: dict[str, list[dict[str, Any]]] = {}

    def timed(label: str, args: list[str], setting: dict[str, str]) -> None:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, **setting}
        load = load_average()
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "purgatory.pipeline", *args, "--master=local[2]", "--overwrite"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - started
        if done.returncode:
            raise SystemExit(f"{label} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        runs.setdefault(label, []).append({"seconds": seconds, "load": load})
        print(f"{label}: {seconds:.1f} s (load before {load})", flush=True)

    timed("analyze, the first job (no archive yet)", jobs["analyze"], archive)
    saved = _wait_for_archive(work / "class-archive")
    runs["the archive saved in the background after it"] = [saved]
    print(f"the archive, saved in the background: {saved['seconds']:.1f} s", flush=True)
    for _ in range(repetitions):
        for name, args in jobs.items():
            timed(name, args, archive)
            timed(f"{name}, no class archive", args, without)
    return {**inputs, "runs": runs}


def _wait_for_archive(directory: Path, seconds: float = 600) -> dict[str, Any]:
    """Wait until the background process has published the class archive in `directory`;
    how long it was still at work after the first job, and the load average before."""
    load = load_average()
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        if list(directory.glob("*.jsa")) and not list(directory.glob("*.claim")):
            return {"seconds": time.perf_counter() - started, "load": load}
        time.sleep(0.5)
    raise SystemExit(f"no class archive saved in {directory} within {seconds:g} s")


def render_small(f: dict[str, Any]) -> str:
    """The Markdown section of a small-jobs run."""
    env = f["environment"]
    lines = [
        SMALL_BEGIN,
        "## Small jobs: wall seconds, Spark's start included",
        "",
        "`python -m benchmarks.pipeline --small --write`: the command line on `local[2]`, each "
        "run a process of its own (Python, the JVM, the session, the job, the table printed), "
        f"alternated, {len(f['runs']['analyze'])} runs each, with the local driver's class "
        "archive (`docs/pipeline.md`; saved in the background after a first job, both timed on "
        "their own: the second is how long the saving process was still at work after the "
        "first job exited) and without it "
        "(`PURGATORY_SPARK_CLASS_ARCHIVE=off`). `analyze`: "
        f"{f['log_bytes'] / 1e6:.2f} MB of JSON Lines event logs ({f['log_operations']:,} "
        f"operations); `replay`: a W1 trace of {f['trace_operations']:,} operations (4 "
        "purgatories), every operation's row written. Target: within 15 s each on a quiet "
        "2-core machine.",
        "",
        f"- {env['date']}; Python {env['python']}, {env['cpu_model']}, {env['cpu_count']} CPUs "
        f"shared with other users; {env['git']}.",
        "",
        "| job | median s | min s | max s | runs (s, load average before) |",
        "|---|---:|---:|---:|---|",
    ]
    for name, runs in f["runs"].items():
        seconds = [run["seconds"] for run in runs]
        each = "; ".join(f"{run['seconds']:.1f} ({run['load']})" for run in runs)
        lines.append(
            f"| {name} | {statistics.median(seconds):.1f} | {min(seconds):.1f} | "
            f"{max(seconds):.1f} | {each} |"
        )
    return "\n".join([*lines, "", SMALL_END, ""])


def section_of(path: Path, begin_marker: str, end_marker: str) -> str:
    """The section between two markers (included) of the existing results file, or ``""``."""
    if not path.exists():
        return ""
    old = path.read_text()
    begin, end = old.find(begin_marker), old.find(end_marker)
    return "" if begin < 0 or end < 0 else old[begin : end + len(end_marker)] + "\n"


def write_section(path: Path, section: str, begin_marker: str, end_marker: str) -> None:
    """Put `section` in the results file: in place of the old one between the same markers,
    else before the analysis written by hand."""
    old = path.read_text() if path.exists() else ""
    current = section_of(path, begin_marker, end_marker)
    if current:
        path.write_text(old.replace(current, section))
        return
    at = old.find(HAND_WRITTEN)
    path.write_text(old + "\n" + section if at < 0 else old[:at] + section + "\n" + old[at:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pipeline")
    parser.add_argument(
        "--small", action="store_true", help="time small jobs (analyze 1 MB, replay 20,000 ops)"
    )
    parser.add_argument("--operations", type=int, default=10_000_000)
    parser.add_argument("--purgatories", type=int, default=8)
    parser.add_argument("--engine-operations", type=int, default=200_000)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--work", default=None, help="directory for the trace (default: temp)")
    parser.add_argument("--write", action="store_true", help="write PIPELINE_RESULTS.md")
    parser.add_argument(
        "--child", nargs=4, metavar=("TRACE", "OUT", "MASTER", "ROWS"), help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--engine-only",
        nargs="?",
        const="",
        metavar="TRACE",
        help="only the engine figures, no Spark: on the operations generated in this process "
        "(or on those of TRACE, a trace directory or file)",
    )
    args = parser.parse_args(argv)
    if args.small:
        work = Path(args.work or tempfile.mkdtemp(prefix="purgatory-small-"))
        figures = {"environment": describe_environment(), **small_jobs(args.repetitions, work)}
        text = render_small(figures)
        print(text)
        if args.write:
            write_section(RESULTS, text, SMALL_BEGIN, SMALL_END)
            print(f"wrote {RESULTS}")
        return 0
    if args.engine_only is not None:
        return _engine_only(args)
    if args.child:
        print(json.dumps(_child_replay(*args.child)))
        return 0

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from purgatory.pipeline import W1, generate, get_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    env = describe_environment()
    load_before = load_average()
    work = Path(args.work or tempfile.mkdtemp(prefix="purgatory-bench-"))
    trace = str(work / "trace")
    w1 = W1(
        purgatories=args.purgatories,
        operations=args.operations // args.purgatories,
        chunk=250_000,
    )
    spark = get_session("local[2]", "purgatory-bench-generate", {"spark.driver.memory": "4g"})
    started = time.perf_counter()
    generate(spark, w1, trace, overwrite=True)
    generate_seconds = time.perf_counter() - started
    spark.stop()
    print(f"generated {w1.purgatories * w1.operations:,} operations in {generate_seconds:.1f} s")

    runs = []
    for master, rows in (("local[1]", "summary"), ("local[2]", "summary"), ("local[1]", "rows")):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.pipeline",
                "--child",
                trace,
                str(work / "out"),
                master,
                rows,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode:
            raise SystemExit(
                f"the {master} replay failed (exit {result.returncode}):\n{result.stderr[-3000:]}"
            )
        run = json.loads(result.stdout.strip().splitlines()[-1])
        run["cores"] = 1 if master == "local[1]" else 2
        runs.append(run)
        print(f"{master} ({rows}): {run['operations']:,} operations in {run['seconds']:.1f} s")

    table = pq.read_table(trace)
    first = table.filter(pc.equal(table["purgatory"], "p0000")).slice(0, args.engine_operations)
    figures = {
        "environment": env,
        "load_before": load_before,
        "operations": w1.purgatories * w1.operations,
        "purgatories": w1.purgatories,
        "generate_seconds": generate_seconds,
        "runs": runs,
        **engine_figures(first, args.repetitions),
        "load_after": load_average(),
    }
    text = render(figures)
    print(text)
    if args.write:
        from .pipeline_spread import BEGIN, END

        kept = section_of(RESULTS, SMALL_BEGIN, SMALL_END) + section_of(RESULTS, BEGIN, END)
        RESULTS.write_text(text + "\n" + kept + _hand_written_part(RESULTS))
        print(f"wrote {RESULTS}")
    return 0


def _engine_only(args: argparse.Namespace) -> int:
    """``--engine-only [TRACE]``: the engine figures alone (JSON on stdout, the line to stderr)."""
    if args.engine_only:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        table = pq.read_table(args.engine_only)
        first = table.filter(pc.equal(table["purgatory"], "p0000"))
        trace = first.slice(0, args.engine_operations)
    else:
        trace = engine_trace(args.operations, args.purgatories, args.engine_operations)
    load = load_average()
    figures = engine_figures(trace, args.repetitions)
    print(json.dumps({"load_before": load, "load_after": load_average(), **figures}, indent=1))
    print(render_engine(figures), file=sys.stderr)
    return 0


HAND_WRITTEN = "<!-- Written by hand from the run above; `--write` keeps what follows. -->"


def _hand_written_part(path: Path) -> str:
    """The analysis below `HAND_WRITTEN` in the existing results file, kept across runs."""
    if not path.exists():
        return ""
    old = path.read_text()
    at = old.find(HAND_WRITTEN)
    return "" if at < 0 else "\n" + old[at:]


def render(f: dict[str, Any]) -> str:
    """The Markdown report of one run."""
    env = f["environment"]
    one, two, with_rows = f["runs"]
    lines = [
        "# Data pipeline: replay throughput and event-log overhead",
        "",
        "`python -m benchmarks.pipeline --write` (see its docstring). One seeded W1 trace "
        f"(20/60 ms latency, 200 ms timeout, 3 of 100 keys, 1000 arrivals/s per purgatory): "
        f"**{f['operations']:,} operations** over {f['purgatories']} purgatories, replayed under "
        "one configuration (tick 1 ms, wheel 1024, purge interval 1000, `trigger=key`).",
        "",
        f"- {env['date']}; Python {env['python']}, {env['cpu_model']}, {env['cpu_count']} CPUs "
        f"shared with other users; load before/after {f['load_before']} / {f['load_after']}; "
        f"{env['git']}.",
        f"- Trace generation (Spark, local[2]): {f['generate_seconds']:.1f} s.",
        "",
        "| master | output | wall s (whole job) | ops/s | ops/s per core | CPU s (driver, "
        "JVM, Python workers) | cores busy on average |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in (one, two, with_rows):
        rate = run["operations"] / run["seconds"]
        output = "summary only" if run["rows"] == "summary" else "summary + every operation's row"
        lines.append(
            f"| {run['master']} | {output} | {run['seconds']:.1f} | {rate:,.0f} | "
            f"{rate / run['cores']:,.0f} | {run['cpu_seconds']:.1f} | "
            f"{run['cpu_seconds'] / run['seconds']:.2f} |"
        )
    lines += [
        "",
        f"Speed-up local[1] -> local[2] (summary only): **{one['seconds'] / two['seconds']:.2f}x**"
        f"; writing every operation's row costs {with_rows['seconds'] / one['seconds']:.2f}x "
        "the summary-only job on local[1].",
        "",
        render_engine(f),
        "",
        f"Event log (same trace, alternated runs): {f['engine_null_us_per_op']:.2f} us/op with "
        "a do-nothing recorder (the purgatory's two calls per operation), "
        f"{f['engine_logged_us_per_op']:.2f} us/op with `JsonLinesEventLog`, so **"
        f"{f['event_log_overhead_us_per_op']:.2f} us per operation** for recording "
        "(record_watch, record_end, formatting and writing the line).",
        "",
        "Samples (CPU s): "
        + "; ".join(
            f"{name}: " + ", ".join(f"{x:.3f}" for x in values)
            for name, values in f["samples"].items()
        )
        + ".",
        "",
    ]
    return "\n".join(lines)


def render_engine(f: dict[str, Any]) -> str:
    """The engine-alone figure: operations per second per core first, then what it came from."""
    rate = f.get("engine_ops_per_core_s", 1e6 / f["engine_us_per_op"])
    low = f.get("engine_ops_per_core_s_min", rate)
    high = f.get("engine_ops_per_core_s_max", rate)
    return (
        f"Engine alone (no Spark, this process, {f['engine_operations']:,} operations of one "
        f"purgatory, CPU time, median of {len(f['samples']['none'])}): "
        f"**{rate:,.0f} operations/s per core** [{low:,.0f}, {high:,.0f}] "
        f"({f['engine_us_per_op']:.2f} us/op; the goal is {ENGINE_GOAL:,.0f}/s per core)."
    )


def run_engine(config: Config, log: Callable[[str], None]) -> dict[str, Any]:
    """The suite's ``pipeline-engine`` workload: the engine alone, on operations generated in
    this process (the pipeline's default trace: 10,000,000 operations over 8 purgatories)."""
    trace = engine_trace(10_000_000, 8, config.engine_operations)
    found = engine_figures(trace, config.engine_repetitions)
    log("  " + render_engine(found))
    n = found["engine_operations"]
    return {
        **found,
        "goal_ops_per_core_s": ENGINE_GOAL,
        "figures": {
            "pipeline engine: operations/s per core": figure(
                [n / seconds for seconds in found["samples"]["none"]], "ops/s", "higher"
            ),
            "pipeline engine: event log overhead": figure(
                [found["event_log_overhead_us_per_op"]], "us/op"
            ),
        },
    }


if __name__ == "__main__":
    raise SystemExit(main())
