"""The order in which `make test` deals the test modules to its workers: the longest first.

`make test` runs pytest on one worker per core with ``--dist loadfile`` (a module's tests stay on
one worker: a Spark module starts its cluster, server or streaming runs once for its tests) and
``--no-loadscope-reorder``, so that pytest-xdist deals the modules in the order the workers
collected them. Its own order, the modules with the most tests first, deals the Spark modules
last (a few long tests each), and one worker then spent the run's last minutes on one of them
while the other had nothing left. Dealt longest first (the greedy rule for scheduling on
identical machines), the modules dealt last are the short ones, and the workers end close
together.

`LONG` holds the modules' measured times (a module and its ``[python]`` twin are dealt apart);
the others follow in pytest-xdist's own order (the most tests first). A run in one process
(no xdist worker) keeps the file order. A module that grows long belongs in `LONG`: ``pytest
-n 2 --dist loadfile --junitxml=FILE`` gives each test's time, setup and teardown included.
"""

from __future__ import annotations

from collections import Counter

import pytest

#: Seconds each module took (its slowest tests' setup and call, summed: a lower bound) in a run
#: of the whole suite on two workers on a busy 2-core machine (pytest --durations=30); shards'
#: from its own run. Only their order matters: rough figures deal the same order.
LONG: dict[str, float] = {
    "test_pipeline_clusters.py": 280,
    "test_pipeline_class_archive.py": 136,
    "test_pipeline_live.py": 64,
    "test_pipeline_stuck.py": 50,
    "test_pipeline_shards.py": 50,
    "test_docs.py": 49,
    "test_differential.py": 47,
    "test_differential_machine.py": 47,
    "test_packaging.py": 46,
    "test_pipeline.py": 38,
    "test_load_model.py": 36,
}


def scope(item: pytest.Item) -> str:
    """What ``--dist loadfile`` keeps on one worker: the module's node id (a core module's
    pure twin, ``tests/test_x.py[python]``, is a module of its own)."""
    return item.nodeid.split("::", 1)[0]


def weight(module: str) -> float:
    return LONG.get(module.rsplit("/", 1)[-1], 0.0)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # not an xdist worker: the file order
        return
    count = Counter(scope(item) for item in items)
    # Stable: the tests of a module stay together and in their order.
    items.sort(key=lambda item: (-weight(scope(item)), -count[scope(item)]))
