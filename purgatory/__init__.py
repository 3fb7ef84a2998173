"""purgatory: park async requests until a condition holds or a deadline passes.

An asyncio-native port of Apache Kafka's ``DelayedOperationPurgatory``: a hierarchical timing
wheel driven by one reaper coroutine, keyed watcher lists, and `DelayedOperation` subclasses
that are awaitable. Subclass `DelayedOperation`, park it with ``await purgatory.watch(op, keys)``
on a `DelayedOperationPurgatory`, and call ``check_and_complete(key)`` when what it waits for
may have changed.

Documentation (getting started, the contract, the API reference, a page per use):
https://asyncio-purgatory.github.io/asyncio-purgatory/

Source, examples and issues: https://github.com/asyncio-purgatory/asyncio-purgatory (the source
distribution carries the documentation's sources, ``docs/``, too).

Modules: ``purgatory.testing`` (`ManualClock`, ``check_invariants``: virtual time for tests),
``purgatory.asgi`` (``cancel_on_disconnect``: tie a parked request to its HTTP connection) and
``purgatory.pipeline`` (Spark jobs; the ``spark`` extra).
"""

from __future__ import annotations

from types import FunctionType as _FunctionType

from ._clock import Alarm as Alarm
from ._clock import Clock as Clock
from ._clock import DrivenClock as DrivenClock
from ._clock import Timer as Timer
from ._errors import OperationCancelled as OperationCancelled
from ._errors import PurgatoryClosed as PurgatoryClosed
from ._errors import PurgatoryError as PurgatoryError
from ._errors import PurgatoryFull as PurgatoryFull
from ._eventlog import JsonLinesEventLog as JsonLinesEventLog
from ._eventlog_arrow import ArrowEventLog as ArrowEventLog
from ._events import EventLog as EventLog
from ._histograms import HistogramBuckets as HistogramBuckets
from ._impl import IMPLEMENTATION as IMPLEMENTATION
from ._operation import DelayedOperation as DelayedOperation
from ._purgatory import DelayedOperationPurgatory as DelayedOperationPurgatory
from ._purgatory import PurgatoryStatistics as PurgatoryStatistics

__version__ = "0.1.0"

__all__ = (
    "IMPLEMENTATION",
    "Alarm",
    "ArrowEventLog",
    "Clock",
    "DelayedOperation",
    "DelayedOperationPurgatory",
    "DrivenClock",
    "EventLog",
    "HistogramBuckets",
    "JsonLinesEventLog",
    "OperationCancelled",
    "PurgatoryClosed",
    "PurgatoryError",
    "PurgatoryFull",
    "PurgatoryStatistics",
    "Timer",
)

# The public path in reprs and help(): the classes', and their methods' (a native method's
# reference function too: its `__wrapped__`), so that help() shows nothing "from" elsewhere.
for _name in __all__:
    _public = globals()[_name]
    if isinstance(_public, type):
        _public.__module__ = __name__
        for _member in vars(_public).values():
            _function = getattr(_member, "__wrapped__", _member)
            if isinstance(_function, _FunctionType):
                _function.__module__ = __name__
del _name, _public, _member, _function
