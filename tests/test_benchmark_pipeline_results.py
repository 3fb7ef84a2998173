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
