from __future__ import annotations

import asyncio

import pytest

from purgatory import DelayedOperation, DelayedOperationPurgatory


class Op(DelayedOperation[str]):
    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.ready = False

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> str:
        return "done"

    def on_expiration(self) -> None:
        pass


@pytest.mark.asyncio
async def test_loop_flavours() -> None:
    loop = asyncio.get_running_loop()
    async with DelayedOperationPurgatory[Op]("smoke") as p:
        op = Op(0.01)
        assert await p.watch(op, ["k"]) == "done"
        assert op.is_expired
    print(type(loop))
