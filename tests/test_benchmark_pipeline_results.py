"""`python -m benchmarks.pipeline --write` replaces the measured part and keeps the analysis."""

from __future__ import annotations

from pathlib import Path

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
