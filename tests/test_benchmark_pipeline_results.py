"""`python -m benchmarks.pipeline --write` replaces the measured part and keeps the analysis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.pipeline import HAND_WRITTEN, _hand_written_part


def test_the_analysis_below_the_marker_survives_a_new_run(tmp_path: Path) -> None:
    results = tmp_path / "PIPELINE_RESULTS.md"
    assert _hand_written_part(results) == ""
    results.write_text(f"# old figures\n\n{HAND_WRITTEN}\n## Against the targets\nwhy\n")
    kept = _hand_written_part(results)
    assert kept == f"\n{HAND_WRITTEN}\n## Against the targets\nwhy\n"
    assert "old figures" not in kept
    results.write_text("# figures, no analysis\n")
    assert _hand_written_part(results) == ""


def test_the_groups_spread_section_is_replaced_in_place_and_kept_by_a_throughput_run(
    tmp_path: Path,
) -> None:
    from benchmarks.pipeline import section_of, write_section
    from benchmarks.pipeline_spread import BEGIN, END

    results = tmp_path / "PIPELINE_RESULTS.md"
    results.write_text(f"# figures\n\n{HAND_WRITTEN}\nwhy\n")
    write_section(results, f"{BEGIN}\nfirst\n{END}\n", BEGIN, END)
    assert results.read_text() == f"# figures\n\n{BEGIN}\nfirst\n{END}\n\n{HAND_WRITTEN}\nwhy\n"
    write_section(results, f"{BEGIN}\nsecond\n{END}\n", BEGIN, END)
    assert results.read_text() == f"# figures\n\n{BEGIN}\nsecond\n{END}\n\n{HAND_WRITTEN}\nwhy\n"
    assert section_of(results, BEGIN, END) == f"{BEGIN}\nsecond\n{END}\n"


def test_the_spread_section_says_the_speed_ups_of_the_fastest_runs() -> None:
    from benchmarks.pipeline_spread import BEGIN, END, render

    def run(label: str, seconds: float) -> dict[str, object]:
        task = {
            "partition": 0,
            "groups": ["p0000@0"],
            "operations": 10,
            "seconds": 1.0,
            "cpu_seconds": 0.5,
            "input_seconds": 0.1,
        }
        return {
            "label": label,
            "seconds": seconds,
            "cpu": {"driver": 1.0, "jvm": 2.0, "python workers": 3.0},
            "tasks": [task],
            "stages": [],
            "load_before": "1.00/1.00/1.00",
            "load_after": "2.00/1.00/1.00",
        }

    figures = {
        "environment": {
            "date": "d",
            "python": "3",
            "cpu_model": "c",
            "cpu_count": 2,
            "git": "g",
        },
        "operations": 80,
        "purgatories": 8,
        "runs": [
            run("local[1], direct read", 30.0),
            run("local[2], direct read", 20.0),
            run("local[2], direct read", 16.0),
            run("local[1], Spark read (before)", 45.0),
            run("local[2], Spark read (before)", 40.0),
        ],
    }
    text = render(figures)
    assert text.startswith(BEGIN)
    assert text.rstrip().endswith(END)
    assert "- local[1] -> local[2], direct read: **1.88x**" in text
    assert "- local[1] -> local[2], Spark read (before): **1.12x**" in text
    assert "- local[1], Spark read -> direct read: **1.50x**" in text
    assert "- local[2], Spark read -> direct read: **2.50x**" in text
    assert "hash" not in text
    assert "standalone" not in text
    assert "| local[2], direct read | 16.0 | 1.0 / 2.0 / 3.0 | p0: 1, 10, 1.0 (0.5; 0.1) |" in text


def test_the_shards_section_says_each_speed_up_local_and_on_the_cluster() -> None:
    """``--shards N --cluster``: unsplit on local[1] -> split on local[2], and unsplit on one
    standalone worker -> split on two, each pair from its fastest runs; without ``--cluster``
    no standalone line."""
    from benchmarks.pipeline_spread import SHARDS_BEGIN, SHARDS_END, _shards_label, render_shards

    def run(label: str, seconds: float, cpu: dict[str, float]) -> dict[str, object]:
        task = {"partition": 0, "groups": ["p0000@0/0"], "operations": 10}
        return {
            "label": label,
            "seconds": seconds,
            "cpu": cpu,
            "tasks": [{**task, "seconds": 1.0, "cpu_seconds": 0.5}],
            "boundaries": ["p0000@0 boundary before shard 1 at 1 s: ... matched"],
            "phases": [{"name": "tasks", "seconds": 1.0, "cpu_seconds": 0.0}],
            "load_before": "1.00/1.00/1.00",
            "load_after": "2.00/1.00/1.00",
        }

    local = {"driver": 1.0, "jvm": 2.0, "python workers": 3.0}
    cluster = {**local, "cluster workers (executor JVMs)": 4.0}
    runs = [
        run("purge interval 0: local[1], unsplit (direct read)", 30.0, local),
        run("purge interval 0: local[2], 2 time shards", 20.0, local),
        run(_shards_label(0, 1, 2), 40.0, cluster),
        run(_shards_label(0, 2, 2), 25.0, cluster),
        run(_shards_label(0, 2, 2), 32.0, cluster),
    ]
    environment = {"date": "d", "python": "3", "cpu_model": "c", "cpu_count": 2, "git": "g"}
    figures = {
        "environment": environment,
        "operations": 80,
        "shards": 2,
        "purge_interval": [0],
        "cluster": True,
        "runs": runs,
    }
    text = render_shards(figures)
    assert text.startswith(SHARDS_BEGIN)
    assert text.rstrip().endswith(SHARDS_END)
    assert "--operations 80 --cluster --write" in text
    assert "- purge interval 0: **1.50x** (wall)" in text
    assert "- purge interval 0, standalone 1 -> 2 workers: **1.60x** (wall)" in text
    assert (
        "| purge interval 0: standalone, 2 one-core workers, 2 time shards | 25.0 | "
        "1.0 / 2.0 / 3.0 / 4.0 | p0: 1, 10, 1.0 (0.5) | tasks 1.0 (0.0) | 1 of 1 |"
    ) in text
    figures = {**figures, "cluster": False, "runs": runs[:2]}
    text = render_shards(figures)
    assert "standalone" not in text
    assert "- purge interval 0: **1.50x** (wall)" in text


def test_the_cluster_runs_alone_take_the_local_runs_of_an_earlier_file() -> None:
    """``--no-local --local-from JSON``: the earlier run's local rows first, then the cluster
    rows; both dates and commits said; another trace's file refused."""
    from benchmarks.pipeline_spread import with_local_runs

    def figures(date: str, git: str, runs: list[dict[str, str]]) -> dict[str, Any]:
        environment = {"date": date, "python": "3", "cpu_model": "c", "cpu_count": 2, "git": git}
        options = {"operations": 80, "purgatories": 1, "shards": 2, "purge_interval": [1000]}
        return {"environment": environment, **options, "cluster": True, "runs": runs}

    local = [{"master": "local[1]", "label": "a"}, {"master": "local[2]", "label": "b"}]
    old_cluster = {"master": "spark://127.0.0.1:1", "label": "old"}
    new_cluster = {"master": "spark://127.0.0.1:2", "label": "new"}
    earlier = figures("d1", "g1", [*local, old_cluster])
    merged = with_local_runs(figures("d2", "g1", [new_cluster]), earlier)
    assert [r["label"] for r in merged["runs"]] == ["a", "b", "new"]
    assert merged["environment"]["date"] == "d1 (local runs), d2 (cluster runs)"
    assert merged["environment"]["git"] == "g1"
    with pytest.raises(SystemExit, match="operations"):
        with_local_runs({**figures("d2", "g1", [new_cluster]), "operations": 40}, earlier)
    with pytest.raises(SystemExit, match="no local run"):
        with_local_runs(figures("d2", "g1", []), figures("d1", "g1", [old_cluster]))


def test_an_earlier_file_of_another_trace_is_refused_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--local-from`` is checked before the runs (minutes each), and only with --no-local:
    refused, `measure` is never called; matching, it is."""
    from benchmarks import pipeline_spread

    def measured(*_: object) -> dict[str, Any]:
        raise AssertionError("measure was called")

    monkeypatch.setattr(pipeline_spread, "measure", measured)
    earlier = tmp_path / "earlier.json"
    earlier.write_text(
        json.dumps(
            {
                "environment": {"date": "d1", "git": "g1"},
                "operations": 80,
                "purgatories": 1,
                "shards": 2,
                "purge_interval": [1000],
                "runs": [{"master": "local[1]", "label": "a"}],
            }
        )
    )
    common = ["--shards", "2", "--purge-interval", "1000", "--local-from", str(earlier)]
    with pytest.raises(SystemExit, match="operations"):
        pipeline_spread.main(["--operations", "40", "--no-local", *common])
    with pytest.raises(SystemExit) as refused:
        pipeline_spread.main(["--operations", "80", *common])
    assert refused.value.code == 2  # (argparse's error: --local-from without --no-local)
    with pytest.raises(AssertionError, match="measure was called"):  # (checked, then measured)
        pipeline_spread.main(["--operations", "80", "--no-local", *common])
