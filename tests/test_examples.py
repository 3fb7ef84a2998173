"""The runnable examples run, and their answers add up."""

from __future__ import annotations

import pytest

from examples import produce_acks_all


@pytest.mark.asyncio
async def test_produce_acks_all_answers_every_request() -> None:
    outcomes = await produce_acks_all.main(requests=200, seed=3)
    assert sum(outcomes.values()) == 200
    assert set(outcomes) <= {"NONE", "REQUEST_TIMED_OUT"}
    assert outcomes.get("NONE", 0) > 0
