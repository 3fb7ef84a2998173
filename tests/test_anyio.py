"""anyio on its asyncio backend: task groups and cancel scopes work with watch()."""

from __future__ import annotations

import anyio
import pytest
from helpers import FlagOperation

from purgatory import DelayedOperationPurgatory


@pytest.mark.parametrize("use_uvloop", [False, True], ids=["asyncio", "uvloop"])
def test_watch_under_anyio_task_groups_and_cancel_scopes(use_uvloop: bool) -> None:
    results: dict[str, object] = {}

    async def main() -> None:
        async with DelayedOperationPurgatory[FlagOperation]("anyio") as purgatory:
            completed = FlagOperation(30, "completed")
            abandoned = FlagOperation(30, "abandoned")
            expiring = FlagOperation(0.02, "expiring")

            async def wait(op: FlagOperation) -> None:
                results[op.name] = await purgatory.watch(op, ["k"])

            async with anyio.create_task_group() as group:
                group.start_soon(wait, completed)
                group.start_soon(wait, expiring)
                with anyio.move_on_after(0.05) as scope:
                    await purgatory.watch(abandoned, ["other"])
                assert scope.cancelled_caught
                completed.ready = True
                purgatory.check_and_complete("k")
            results["abandoned"] = abandoned.is_cancelled
            results["expired"] = expiring.is_expired
            results["delayed"] = purgatory.num_delayed()

    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": use_uvloop})
    assert results == {
        "completed": "completed done",
        "expiring": "expiring done",
        "abandoned": True,
        "expired": True,
        "delayed": 0,
    }
