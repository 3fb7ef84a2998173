"""docs/metrics.md's FastAPI recipe (``/metrics`` beside the routes), served for real.

tests/test_docs.py runs the recipe's block as a reader copies it (Starlette's TestClient, its
Output compared). Here the same code, run as is, is served by uvicorn on a loopback port and
scraped over TCP as Prometheus scrapes: ``/metrics`` redirects to the mounted app, and what it
answers, parsed by prometheus_client's own parser, counts the requests parked at that moment,
then their completions, carried on from the app's earlier starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_support import client, uvicorn_serving
from markdown_blocks import ROOT, chains
from prometheus_client.parser import text_string_to_metric_families

PAGE = ROOT / "docs" / "metrics.md"
#: Requests parked on one job while the recipe's server is scraped.
PARKED = 20


def recipe() -> dict[str, Any]:
    """The recipe's namespace, its code run as the page shows it (its prints kept apart)."""
    (chain,) = [c for c in chains(PAGE) if "make_asgi_app(" in c[-1].code]
    namespace: dict[str, Any] = {"__name__": "recipe"}
    with contextlib.redirect_stdout(io.StringIO()):
        for block in chain:
            exec(compile(block.code, str(Path(block.path)), "exec"), namespace)
    return namespace


async def scrape(http: httpx.AsyncClient, base: str) -> dict[str, float]:
    """The `jobs` purgatory's samples, scraped at ``/metrics`` as Prometheus asks for it."""
    answer = await http.get(f"{base}/metrics", follow_redirects=True)
    assert answer.status_code == 200
    assert [r.status_code for r in answer.history] == [307]
    assert answer.url.path == "/metrics/"
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
        if sample.labels.get("purgatory") == "jobs"
    }


@pytest.mark.asyncio
async def test_the_fastapi_metrics_recipe_served_by_uvicorn_is_scraped_as_prometheus_would() -> (
    None
):
    namespace = recipe()  # the page's two starts ran: 2 completed, 2 expired
    async with uvicorn_serving(namespace["app"], lifespan="on") as (_, base), client() as http:
        before = await scrape(http, base)
        assert before["purgatory_completed_total"] == 2
        assert before["purgatory_expired_total"] == 2
        assert before["purgatory_delayed"] == 0
        parked = [
            asyncio.create_task(http.get(f"{base}/jobs/release", params={"timeout": 30}))
            for _ in range(PARKED)
        ]
        async with asyncio.timeout(30):
            while (await scrape(http, base))["purgatory_delayed"] < PARKED:
                await asyncio.sleep(0.02)
        during = await scrape(http, base)
        assert during["purgatory_delayed"] == PARKED
        assert during["purgatory_watched"] == PARKED  # one key each
        woken = await http.post(f"{base}/jobs/release")
        assert woken.json() == {"woken": PARKED}
        answers = await asyncio.gather(*parked)
        assert [answer.json() for answer in answers] == [{"done": True}] * PARKED
        after = await scrape(http, base)
    assert after["purgatory_delayed"] == 0
    assert after["purgatory_completed_total"] == 2 + PARKED
    assert after["purgatory_expired_total"] == 2
