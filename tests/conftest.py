"""Shared test configuration: every async test runs on the stock asyncio loop and on uvloop.

A test marked ``virtualclock`` (or in a module so marked) runs them in virtual time (see
virtual_time.py): the loop's clock jumps to the next timer whenever the loop would sleep, so
sleeps, timeouts and expiries take no wall time and time reads exactly. One also marked
``realclock`` runs on the real clock, for what only a real clock shows.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import uvloop
from virtual_time import VirtualTimeLoop, VirtualTimeUVLoop

# No Spark driver the tests start keeps or uses an archive of its classes in the user's cache:
# whichever test started the first driver would wait 10-15 s at its exit to save it and find a
# line about it on its stderr. test_pipeline_class_archive.py tests the archive in a directory
# of its own.
os.environ["PURGATORY_SPARK_CLASS_ARCHIVE"] = "off"

# Each core test module runs on both implementations in this one run (tests/implementations.py);
# `make test`'s workers are dealt the longest modules first (tests/scheduling.py).
pytest_plugins = ["implementations", "scheduling"]


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """pytest-asyncio parametrises each async test over these loop factories."""
    if item.get_closest_marker("virtualclock") and not item.get_closest_marker("realclock"):
        return {"asyncio": VirtualTimeLoop, "uvloop": VirtualTimeUVLoop}
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one local[2] Spark session the pipeline tests share (tests/spark_support.py)."""
    from spark_support import local_session

    yield from local_session()


@pytest.fixture
def no_errors_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fail the test if anything logged an error while it ran (its setup included), on any
    thread: an exporter's failure is reported by a log line (a tap's, through the loop's
    exception handler or the ``purgatory`` logger; a callback's, by the OpenTelemetry SDK's),
    not raised, so a test that reads only the figures would pass beside a traceback."""
    yield
    errors = [
        f"{record.name}: {record.getMessage()}"
        for record in [*caplog.get_records("setup"), *caplog.get_records("call")]
        if record.levelno >= logging.ERROR
    ]
    assert not errors, f"errors were logged: {errors}"
