"""Shared test configuration: every async test runs on the stock asyncio loop and on uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import uvloop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """pytest-asyncio parametrises each async test over these loop factories."""
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one local[2] Spark session the pipeline tests share (tests/spark_support.py)."""
    from spark_support import local_session

    yield from local_session()
