"""Start a leader and its followers as separate OS processes on loopback, and drive them.

Used by ``serve``, by the demo and by the tests: the leader is ``python -m examples.minibroker
leader`` (it binds a free port unless told one, and prints ``bootstrap 127.0.0.1:PORT``), each
follower ``python -m examples.minibroker follower``. The handle can pause (SIGSTOP), resume,
kill (SIGKILL) and restart a follower, and ask the leader for its statistics over its stdin.
With ``metrics_port`` set, the leader also serves ``/metrics`` (`metrics_url`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .coordinator import GroupSettings
from .settings import BrokerSettings

__all__ = ("Cluster", "ClusterConfig", "ClusterStartError")

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ClusterConfig(BrokerSettings):
    """What the processes are started with: the broker's own settings (`BrokerSettings`, for
    the leader; its ``/metrics`` on loopback), and the cluster's (Kafka's names)."""

    port: int = 0
    followers: int = 2
    replica_fetch_wait_max_ms: int = 200
    group_initial_rebalance_delay_ms: int = GroupSettings.initial_rebalance_delay_ms
    group_min_session_timeout_ms: int = GroupSettings.min_session_timeout_ms

    @property
    def follower_ids(self) -> tuple[int, ...]:
        return tuple(range(1, self.followers + 1))


class ClusterStartError(RuntimeError):
    """The leader did not start; the message says why (``address already in use``, say)."""


class Cluster:
    """A running leader and followers; use ``async with Cluster(config) as cluster``."""

    def __init__(
        self,
        config: ClusterConfig | None = None,
        *,
        log: IO[bytes] | None = None,
        start_followers: bool = True,
    ) -> None:
        self.config = config or ClusterConfig()
        self.start_followers = start_followers
        self.port = 0
        self.metrics_url: str | None = None
        """Where the leader serves ``/metrics``, once started (``None``: it does not)."""
        self.leader: asyncio.subprocess.Process | None = None
        self.followers: dict[int, asyncio.subprocess.Process] = {}
        self._log = log
        self._stats_lock = asyncio.Lock()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def __aenter__(self) -> Cluster:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _stderr(self) -> int | IO[bytes]:
        return self._log if self._log is not None else asyncio.subprocess.DEVNULL

    async def start(self) -> None:
        """Start the leader, wait for its bootstrap line, then start the followers."""
        c = self.config
        topics = ",".join(f"{name}:{count}" for name, count in c.topics.items())
        self.leader = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "examples.minibroker",
            "leader",
            "--port",
            str(c.port),
            "--followers",
            ",".join(map(str, c.follower_ids)),
            "--topics",
            topics,
            "--min-insync-replicas",
            str(c.min_insync_replicas),
            "--replica-lag-time-max-ms",
            str(c.replica_lag_time_max_ms),
            "--max-request-bytes",
            str(c.max_request_bytes),
            "--max-message-bytes",
            str(c.max_message_bytes),
            *(() if c.auto_create_topics else ("--no-auto-create-topics",)),
            "--num-partitions",
            str(c.num_partitions),
            "--group-initial-rebalance-delay-ms",
            str(c.group_initial_rebalance_delay_ms),
            "--group-min-session-timeout-ms",
            str(c.group_min_session_timeout_ms),
            *(() if c.metrics_port is None else ("--metrics-port", str(c.metrics_port))),
            *(() if c.event_log is None else ("--event-log", os.path.abspath(c.event_log))),
            "--event-log-interval",
            str(c.event_log_interval),
            *(("--event-log-watches",) if c.event_log_watches else ()),
            "--control-stdin",
            cwd=REPO_ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._stderr(),
            # Its own session: a Ctrl-C on the terminal reaches the parent alone, which then
            # stops the followers before the leader (so they see no leader vanish).
            start_new_session=True,
        )
        assert self.leader.stdout is not None
        line = await asyncio.wait_for(self.leader.stdout.readline(), 30)
        if not line.startswith(b"bootstrap "):
            await self.stop()
            if line.startswith(b"error "):
                raise ClusterStartError(line[6:].decode().strip())
            raise ClusterStartError(f"the leader did not start (it said {line!r})")
        self.port = int(line.split(b":")[-1])
        if c.metrics_port is not None:
            line = await asyncio.wait_for(self.leader.stdout.readline(), 30)
            if not line.startswith(b"metrics "):
                await self.stop()
                raise ClusterStartError(f"the leader did not serve metrics (it said {line!r})")
            self.metrics_url = line[8:].decode().strip()
        if self.start_followers:  # else: replicas the leader waits for, that never come
            for broker_id in c.follower_ids:
                await self.start_follower(broker_id)
            await self.wait_for_followers()

    async def wait_for_followers(self, timeout: float = 30) -> None:
        """Return once every follower has fetched from the leader (so acks=all can complete).

        A follower process takes a moment to start; until its first fetch the leader counts it
        in sync but has no news from it, and a produce with acks=all would wait for it.
        """
        deadline = asyncio.get_running_loop().time() + timeout
        while (await self.stats())["followers_seen"] != list(self.config.follower_ids):
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"the followers did not start within {timeout} s")
            await asyncio.sleep(0.02)

    async def start_follower(self, broker_id: int) -> None:
        """Start (or restart) follower `broker_id`."""
        self.followers[broker_id] = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "examples.minibroker",
            "follower",
            "--broker-id",
            str(broker_id),
            "--leader",
            self.bootstrap,
            "--fetch-wait-max-ms",
            str(self.config.replica_fetch_wait_max_ms),
            "--control-stdin",
            cwd=REPO_ROOT,
            stdin=asyncio.subprocess.PIPE,  # its end, if we die, ends the follower too
            stdout=asyncio.subprocess.DEVNULL,
            stderr=self._stderr(),
            start_new_session=True,
        )

    def pause(self, *broker_ids: int) -> None:
        """SIGSTOP followers: they stop fetching, and fall out of the ISR after the lag time."""
        for broker_id in broker_ids:
            os.kill(self.followers[broker_id].pid, signal.SIGSTOP)

    def resume(self, *broker_ids: int) -> None:
        """SIGCONT paused followers."""
        for broker_id in broker_ids:
            os.kill(self.followers[broker_id].pid, signal.SIGCONT)

    async def kill(self, broker_id: int) -> None:
        """SIGKILL a follower and reap it."""
        process = self.followers[broker_id]
        process.kill()
        await asyncio.wait_for(process.wait(), 10)

    async def stats(self) -> dict[str, Any]:
        """The leader's statistics (its ``stats`` admin command): gauges, peaks, counters, ISR."""
        leader = self.leader
        assert leader is not None
        assert leader.stdin is not None
        assert leader.stdout is not None
        async with self._stats_lock:
            leader.stdin.write(b"stats\n")
            await leader.stdin.drain()
            while True:
                line = await asyncio.wait_for(leader.stdout.readline(), 10)
                if not line:
                    raise RuntimeError("the leader exited")
                if line.startswith(b"stats "):
                    stats: dict[str, Any] = json.loads(line[6:])
                    return stats

    async def stop(self) -> None:
        """SIGTERM the followers, then the leader (SIGCONT first, for paused followers).

        In that order, so that no follower sees its leader go and reports it. What lingers
        past 10 s is killed.
        """
        await _terminate(list(self.followers.values()))
        if self.leader is not None:
            await _terminate([self.leader])

    def returncodes(self) -> dict[str, int | None]:
        """Each process's exit status (``None``: still running)."""
        codes = {f"follower-{i}": p.returncode for i, p in self.followers.items()}
        if self.leader is not None:
            codes["leader"] = self.leader.returncode
        return codes


async def _terminate(processes: list[asyncio.subprocess.Process]) -> None:
    for process in processes:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
                process.terminate()
    for process in processes:
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()
