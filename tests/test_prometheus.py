"""`purgatory.prometheus`: a real scrape over HTTP, parsed by prometheus_client's own parser.

The collector is served by prometheus_client's ``start_http_server`` on loopback, as an
application would serve it: the scrape is answered on the server's threads, which read each
purgatory on the test's event loop.
"""

from __future__ import annotations

import asyncio
import gc
import math
import urllib.request
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from helpers import FlagOperation, import_error
from metrics_support import scene
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from purgatory import DelayedOperationPurgatory, HistogramBuckets, PurgatoryStatistics
from purgatory._metrics import FIELDS
from purgatory.prometheus import LABEL, PurgatoryCollector
from purgatory.testing import ManualClock

#: Every exporter test fails on an error logged beside its figures (conftest.py).
pytestmark = pytest.mark.usefixtures("no_errors_logged")

Families = dict[str, tuple[str, str, dict[str, float]]]
"""family name -> (type, help, {purgatory: value})"""
Served = tuple[CollectorRegistry, str]
"""What the `served` fixture gives: the registry, and its ``/metrics`` URL."""


@pytest_asyncio.fixture
async def served() -> AsyncIterator[Served]:
    """A registry of its own, served on a free loopback port; its ``/metrics`` URL."""
    registry = CollectorRegistry()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield registry, f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        await asyncio.to_thread(server.shutdown)
        server.server_close()
        thread.join()


async def scrape(url: str) -> Families:
    """GET `url` from another thread (this loop stays free to answer) and parse it."""

    def get() -> str:
        with urllib.request.urlopen(url, timeout=10) as response:
            text: str = response.read().decode()
        return text

    families: Families = {}
    for family in text_string_to_metric_families(await asyncio.to_thread(get)):
        values = {sample.labels[LABEL]: sample.value for sample in family.samples}
        families[family.name] = (family.type, family.documentation, values)
    return families


def expected(stats: PurgatoryStatistics, field_attribute: str) -> float:
    return float(getattr(stats, field_attribute))


@pytest.mark.asyncio
async def test_a_scrape_shows_each_purgatorys_gauges_and_counters(served: Served) -> None:
    registry, url = served
    s = scene()
    registry.register(PurgatoryCollector([s.produce, s.fetch]))
    families = await scrape(url)
    produce, fetch = s.produce.statistics(), s.fetch.statistics()
    # Every field, under its Prometheus name (counters as ..._total, seconds as ..._seconds).
    names = {
        "purgatory_delayed": ("gauge", "delayed"),
        "purgatory_watched": ("gauge", "watched"),
        "purgatory_keys": ("gauge", "keys"),
        "purgatory_next_deadline_seconds": ("gauge", "next_deadline_in"),
        "purgatory_completed": ("counter", "completed"),
        "purgatory_expired": ("counter", "expired"),
        "purgatory_drained": ("counter", "drained"),
        "purgatory_cancelled": ("counter", "cancelled"),
        "purgatory_purged": ("counter", "purged"),
        "purgatory_timer_passes": ("counter", "timer_passes"),
        "purgatory_purges": ("counter", "purges"),
    }
    assert set(families) == set(names)
    for name, (kind, attribute) in names.items():
        assert families[name][0] == kind, name
        assert families[name][2] == {
            "produce": expected(produce, attribute),
            "fetch": expected(fetch, attribute),
        }, name
    help_texts = {field.attribute: field.description for field in FIELDS}
    assert families["purgatory_delayed"][1] == help_texts["delayed"]
    # The figures the docs explain: one operation parked, on two keys; the expired one's
    # entry not purged yet: watched counts 3 entries while 1 operation waits.
    assert families["purgatory_delayed"][2]["produce"] == 1
    assert families["purgatory_watched"][2]["produce"] == 3
    for counter in ("completed", "expired", "cancelled"):
        assert families[f"purgatory_{counter}"][2]["produce"] == 1
    assert 0 < families["purgatory_next_deadline_seconds"][2]["produce"] <= 9  # parked at 10
    assert families["purgatory_next_deadline_seconds"][2]["fetch"] == math.inf  # none timed
    # A purge brings watched down to what waits (2 entries of the parked operation).
    s.produce.purge()
    families = await scrape(url)
    assert families["purgatory_watched"][2]["produce"] == 2
    assert families["purgatory_purged"][2]["produce"] == 1


@pytest.mark.asyncio
async def test_a_purgatory_shut_down_or_gone_leaves_the_scrape(served: Served) -> None:
    registry, url = served
    s = scene()
    collector = PurgatoryCollector([s.produce])
    collector.add(s.fetch)
    registry.register(collector)
    await s.fetch.shutdown()
    assert set((await scrape(url))["purgatory_delayed"][2]) == {"produce"}
    del s  # the clock, the purgatories, the operations: nothing else holds them
    gc.collect()
    assert (await scrape(url))["purgatory_delayed"][2] == {}  # no sample: the family stays


def histogram_samples(text: str, family: str) -> dict[tuple[str, ...], float]:
    """The samples of one histogram family of a scrape's text, by (name, its labels but
    ``purgatory``, sorted)."""
    (found,) = [f for f in text_string_to_metric_families(text) if f.name == family]
    assert found.type == "histogram"
    return {
        (sample.name, *sorted(f"{k}={v}" for k, v in sample.labels.items() if k != LABEL)): (
            sample.value
        )
        for sample in found.samples
    }


@pytest.mark.asyncio
async def test_histograms_of_time_parked_and_expiry_lateness(served: Served) -> None:
    """Opt-in histograms: how long operations stayed parked, by outcome, and how late the
    expiries came; the bounds are the user's. On a driven clock each pass feeds them."""
    registry, url = served
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("hist", clock=clock, tick=0.01)
    buckets = HistogramBuckets(parked=(0.1, 1.0), lateness=(0.005, 0.05))
    registry.register(PurgatoryCollector([p], histograms=buckets))
    ops = [FlagOperation(timeout, str(i)) for i, timeout in enumerate((0.5, 0.5, 0.503, 5.0))]
    for op in ops:
        p.try_complete_else_watch(op, ["k"])
    clock.advance(0.05)
    ops[0].ready = True
    assert p.check_and_complete("k") == 1  # parked 0.05 s
    clock.advance(0.45)  # 1 expires at 0.5, on time
    clock.advance(0.01)  # 2 at 0.51: its 0.503 rounded up to the tick
    assert p.cancel_for_key("k") == [ops[3]]  # parked 0.51 s
    clock.advance(0.0)  # the pass that takes the batch

    def get() -> str:
        with urllib.request.urlopen(url, timeout=10) as response:
            text: str = response.read().decode()
        return text

    text = await asyncio.to_thread(get)
    parked = histogram_samples(text, "purgatory_parked_seconds")
    assert parked[("purgatory_parked_seconds_bucket", "le=0.1", "outcome=completed")] == 1
    assert parked[("purgatory_parked_seconds_bucket", "le=0.1", "outcome=expired")] == 0
    assert parked[("purgatory_parked_seconds_bucket", "le=1.0", "outcome=expired")] == 2
    assert parked[("purgatory_parked_seconds_bucket", "le=+Inf", "outcome=cancelled")] == 1
    assert parked[("purgatory_parked_seconds_count", "outcome=drained")] == 0
    assert parked[("purgatory_parked_seconds_sum", "outcome=cancelled")] == pytest.approx(0.51)
    assert parked[("purgatory_parked_seconds_sum", "outcome=expired")] == pytest.approx(1.01)
    late = histogram_samples(text, "purgatory_expiry_lateness_seconds")
    assert late[("purgatory_expiry_lateness_seconds_bucket", "le=0.005")] == 1  # on time
    assert late[("purgatory_expiry_lateness_seconds_bucket", "le=0.05")] == 2  # 7 ms late
    assert late[("purgatory_expiry_lateness_seconds_sum",)] == pytest.approx(0.007)


def test_without_histograms_the_purgatory_is_not_tapped() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("plain", clock=clock)
    collector = PurgatoryCollector([p])
    assert p._sink is None  # its hot path keeps skipping the event sink
    assert {family.name for family in collector.describe()} == {
        f"purgatory_{field.metric}" + ("_seconds" if field.unit == "s" else "") for field in FIELDS
    }


def test_registering_reads_no_purgatory() -> None:
    """describe() names the families without samples: a registry that auto-describes (as the
    default one does) reads nothing until the first scrape."""
    s = scene()
    collector = PurgatoryCollector([s.produce])
    families = list(collector.describe())
    assert [family.samples for family in families] == [[]] * len(FIELDS)
    CollectorRegistry(auto_describe=True).register(collector)


def test_without_prometheus_client_the_import_says_what_to_install() -> None:
    assert import_error("purgatory.prometheus", without="prometheus_client") == (
        "purgatory.prometheus needs prometheus_client: "
        "pip install 'asyncio-purgatory[prometheus]'\n"
    )
