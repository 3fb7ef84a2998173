"""The data pipeline on Spark: generate, replay and analyse purgatory workloads (``[spark]``).

- ``generate``: a seeded W1 trace (Parquet), or a trace made from recorded event logs;
- ``replay``: every (purgatory, configuration) of a trace through the real
  `DelayedOperationPurgatory` under `purgatory.testing.ManualClock`, in virtual time;
- ``analyze``: summaries per purgatory, key and time window of recorded event logs
  (`purgatory.JsonLinesEventLog`);
- ``sweep``: generate, replay over a grid, print the summary and chart it;
- ``calibrate``: measure a `CostProfile` for the load model (``--cost-profile`` of replay and
  sweep: each group served as one core serves an event loop).

Command line: ``python -m purgatory.pipeline --help``. Schemas: ``docs/pipeline-schemas.md``.
Only this subpackage imports pyspark; ``import purgatory`` stays standard-library only.
"""

from __future__ import annotations

from ._generate import TRACE_SCHEMA as TRACE_SCHEMA
from ._generate import W1 as W1
from ._jobs import SHARED_SUMMARY_COLUMNS as SHARED_SUMMARY_COLUMNS
from ._jobs import TraceError as TraceError
from ._jobs import analyze as analyze
from ._jobs import generate as generate
from ._jobs import load_trace as load_trace
from ._jobs import replay as replay
from ._jobs import trace_from_log as trace_from_log
from ._load import CostProfile as CostProfile
from ._load import load_profile as load_profile
from ._replay import ReplayConfig as ReplayConfig
from ._replay import replay_table as replay_table
from ._spark import get_session as get_session

__all__ = (
    "SHARED_SUMMARY_COLUMNS",
    "TRACE_SCHEMA",
    "W1",
    "CostProfile",
    "ReplayConfig",
    "TraceError",
    "analyze",
    "generate",
    "get_session",
    "load_profile",
    "load_trace",
    "replay",
    "replay_table",
    "trace_from_log",
)
