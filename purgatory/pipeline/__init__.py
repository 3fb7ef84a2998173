"""The data pipeline on Spark: generate, replay and analyse purgatory workloads (``[spark]``).

- ``generate``: a seeded W1 trace (Parquet), or a trace made from recorded event logs;
- ``replay``: every (purgatory, configuration) of a trace through the real
  `DelayedOperationPurgatory` under `purgatory.testing.ManualClock`, in virtual time;
- ``analyze``: summaries per purgatory, key and time window of recorded event logs
  (`purgatory.JsonLinesEventLog`, `purgatory.ArrowEventLog`); ``analyze --follow`` keeps the
  windows up to date while recorders write (Structured Streaming, `follow`);
- ``sweep``: generate, replay over a grid, print the summary and chart it;
- ``calibrate``: measure a `CostProfile` for the load model (``--cost-profile`` of replay and
  sweep: each group served as one core serves an event loop).

`register_data_sources` makes event logs and traces Spark data sources of their own:
``spark.read.format("purgatory-events")``, ``spark.readStream.format("purgatory-events")`` and
``spark.read.format("purgatory-trace")``.

Command line: ``python -m purgatory.pipeline --help``. Schemas: ``docs/pipeline-schemas.md``.
Only this subpackage imports pyspark; ``import purgatory`` stays standard-library only.

The names below are imported on first use, so ``import purgatory.pipeline`` and the command
line's ``--help`` work without the ``spark`` extra; using a name then says what to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._datasource import register_data_sources as register_data_sources
    from ._frames import TraceError as TraceError
    from ._generate import TRACE_SCHEMA as TRACE_SCHEMA
    from ._generate import W1 as W1
    from ._job_eventlog import analyze as analyze
    from ._job_eventlog import load_event_log as load_event_log
    from ._job_follow import follow as follow
    from ._job_replay import replay as replay
    from ._job_trace import generate as generate
    from ._job_trace import load_trace as load_trace
    from ._job_trace import trace_anchors as trace_anchors
    from ._job_trace import trace_from_log as trace_from_log
    from ._load import CostProfile as CostProfile
    from ._load import load_profile as load_profile
    from ._replay import ReplayConfig as ReplayConfig
    from ._replay import replay_table as replay_table
    from ._spark import get_session as get_session
    from ._summary import SHARED_SUMMARY_COLUMNS as SHARED_SUMMARY_COLUMNS

__all__ = (
    "SHARED_SUMMARY_COLUMNS",
    "TRACE_SCHEMA",
    "W1",
    "CostProfile",
    "ReplayConfig",
    "TraceError",
    "analyze",
    "follow",
    "generate",
    "get_session",
    "load_event_log",
    "load_profile",
    "load_trace",
    "register_data_sources",
    "replay",
    "replay_table",
    "trace_anchors",
    "trace_from_log",
)

_HOME = {
    "TRACE_SCHEMA": "_generate",
    "W1": "_generate",
    "SHARED_SUMMARY_COLUMNS": "_summary",
    "TraceError": "_frames",
    "analyze": "_job_eventlog",
    "load_event_log": "_job_eventlog",
    "follow": "_job_follow",
    "register_data_sources": "_datasource",
    "generate": "_job_trace",
    "load_trace": "_job_trace",
    "replay": "_job_replay",
    "trace_anchors": "_job_trace",
    "trace_from_log": "_job_trace",
    "CostProfile": "_load",
    "load_profile": "_load",
    "ReplayConfig": "_replay",
    "replay_table": "_replay",
    "get_session": "_spark",
}


def __getattr__(name: str) -> Any:
    """Import a public name from its private module on first use (PEP 562)."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(f"{__name__}.{home}")
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"purgatory.pipeline.{name} needs the Spark extra (no module {exc.name!r}): "
            "pip install 'asyncio-purgatory[spark]'",
            name=exc.name,
        ) from exc
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
