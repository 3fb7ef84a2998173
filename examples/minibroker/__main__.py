"""A Kafka-protocol broker whose waits are parked in purgatories: a leader and followers on
loopback, for unmodified Kafka clients. Run from the repository root:

    python -m examples.minibroker serve --port 9092   # leader + 2 followers; Ctrl-C stops
    python -m examples.minibroker demo                # the demo, with its summary table
    python -m examples.minibroker serve --event-log events/   # recording what it parks

Both serve the purgatories' gauges and counters for Prometheus at /metrics on loopback, and
print where. The commands leader, follower and member are the processes serve and the demo
start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import Any

from .cluster import Cluster, ClusterConfig, ClusterStartError
from .coordinator import GroupSettings
from .server import BrokerConfig, run_leader


def _topics(text: str) -> dict[str, int]:
    topics = {}
    for item in filter(None, text.split(",")):  # "" means no topic
        name, _, count = item.partition(":")
        topics[name] = int(count or 1)
    return topics


def _ids(text: str) -> tuple[int, ...]:
    return tuple(int(item) for item in text.split(",") if item)


async def _serve(args: argparse.Namespace) -> int:
    config = ClusterConfig(
        port=args.port,
        followers=args.followers,
        group_initial_rebalance_delay_ms=args.group_initial_rebalance_delay_ms,
        group_min_session_timeout_ms=args.group_min_session_timeout_ms,
        **_broker_settings(args),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with Cluster(config, log=sys.stderr.buffer) as cluster:
            print(f"bootstrap {cluster.bootstrap}", flush=True)
            if cluster.metrics_url is not None:
                print(f"metrics {cluster.metrics_url}", flush=True)
            await stop.wait()
    except ClusterStartError as exc:
        print(f"minibroker: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written (the command examples keep their lines)."""


def _broker_options(parser: argparse.ArgumentParser) -> None:
    """The options `serve` passes on to the leader (Kafka's names)."""
    parser.add_argument(
        "--topics",
        default="demo:4",
        metavar="NAME:N,...",
        help="topics created at start (default: %(default)s)",
    )
    parser.add_argument(
        "--min-insync-replicas",
        type=int,
        metavar="N",
        default=2,
        help="min.insync.replicas (default: %(default)s)",
    )
    parser.add_argument(
        "--replica-lag-time-max-ms",
        type=int,
        metavar="MS",
        default=1000,
        help="replica.lag.time.max.ms (default: %(default)s)",
    )
    parser.add_argument(
        "--no-auto-create-topics",
        dest="auto_create_topics",
        action="store_false",
        help="unknown topics get UNKNOWN_TOPIC_OR_PARTITION (auto.create.topics.enable=false; "
        "default: created on first use)",
    )
    parser.add_argument(
        "--num-partitions",
        type=int,
        metavar="N",
        default=4,
        help="partitions of a topic created on first use (default: %(default)s)",
    )
    parser.add_argument(
        "--group-initial-rebalance-delay-ms",
        type=int,
        metavar="MS",
        default=GroupSettings.initial_rebalance_delay_ms,
        help="wait for more members before a new group's first generation "
        "(default: %(default)s; Kafka: 3000)",
    )
    parser.add_argument(
        "--group-min-session-timeout-ms",
        type=int,
        metavar="MS",
        default=GroupSettings.min_session_timeout_ms,
        help="shortest session.timeout.ms a consumer may ask for (default: %(default)s; Kafka: "
        "6000)",
    )


def _broker_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The `BrokerSettings` that `_broker_options`, ``--metrics-port`` and ``--event-log``
    set."""
    return {
        "topics": _topics(args.topics),
        "min_insync_replicas": args.min_insync_replicas,
        "replica_lag_time_max_ms": args.replica_lag_time_max_ms,
        "auto_create_topics": args.auto_create_topics,
        "num_partitions": args.num_partitions,
        "metrics_port": args.metrics_port,
        "event_log": args.event_log,
        "event_log_interval": args.event_log_interval,
        "event_log_watches": args.event_log_watches,
    }


def _directory(text: str) -> str:
    """A directory for the event logs, absolute (the leader runs from the repository root)."""
    return os.path.abspath(text)


def _event_log_options(parser: argparse.ArgumentParser, *, watches: bool = True) -> None:
    """``--event-log DIR``: the leader's purgatories record there (with `watches`, also
    ``--event-log-watches``: not the demo's, a scripted run that ends cleanly)."""
    parser.add_argument(
        "--event-log",
        type=_directory,
        default=None,
        metavar="DIR",
        help="record every operation of the leader's purgatories in JSON Lines files in DIR, "
        "for python -m purgatory.pipeline analyze (default: no recording)",
    )
    parser.add_argument(
        "--event-log-interval",
        type=float,
        default=10.0,
        metavar="S",
        help="publish the current event-log file every S seconds, for "
        "'analyze --follow' (default: %(default)s)",
    )
    if not watches:
        return
    parser.add_argument(
        "--event-log-watches",
        action="store_true",
        help="also record each operation as it is watched, for 'analyze --follow --stuck', "
        "which reports the operations whose end never came (twice the records)",
    )


def _metrics_options(parser: argparse.ArgumentParser, default: int) -> None:
    """``--metrics-port`` / ``--no-metrics``: where the leader serves ``/metrics``."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=default,
        metavar="PORT",
        help="serve the purgatories' metrics for Prometheus at http://127.0.0.1:PORT/metrics, "
        "0: any free port (default: %(default)s)",
    )
    parser.add_argument(
        "--no-metrics",
        dest="metrics_port",
        action="store_const",
        const=None,
        help="serve no /metrics",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m examples.minibroker", description=__doc__, formatter_class=_Formatter
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name, help=summary, description=summary, formatter_class=_Formatter
        )

    serve = command("serve", "run a leader and its followers on loopback")
    serve.add_argument(
        "--port",
        type=int,
        default=9092,
        metavar="PORT",
        help="0: any free port (default: %(default)s)",
    )
    serve.add_argument(
        "--followers",
        type=int,
        default=2,
        metavar="N",
        help="follower processes (default: %(default)s)",
    )
    _broker_options(serve)
    _metrics_options(serve, default=9464)  # the port OpenTelemetry's Prometheus exporter uses
    _event_log_options(serve)

    demo = command("demo", "the demo: load, a paused follower, a summary")
    demo.add_argument(
        "--seed", type=int, default=7, metavar="N", help="the load's seed (default: %(default)s)"
    )
    demo.add_argument(
        "--seconds",
        type=float,
        default=12.0,
        metavar="S",
        help="length of the load (default: %(default)s)",
    )
    demo.add_argument("--broker-log", metavar="PATH", help="keep the brokers' logs in this file")
    _metrics_options(demo, default=0)
    _event_log_options(demo, watches=False)

    leader = command("leader", "one leader process (serve starts it)")
    leader.add_argument("--port", type=int, default=0)
    leader.add_argument("--broker-id", type=int, default=0)
    leader.add_argument("--followers", type=_ids, default=(1, 2))
    _broker_options(leader)
    _event_log_options(leader)
    leader.add_argument("--max-request-bytes", type=int, default=8 * 1024 * 1024)
    leader.add_argument("--max-message-bytes", type=int, default=1024 * 1024)
    leader.add_argument("--metrics-port", type=int, help="serve /metrics (default: none)")
    leader.add_argument(
        "--control-stdin", action="store_true", help="commands on stdin; stop at its end"
    )

    member = command("member", "one consumer-group member, until killed")
    member.add_argument("--bootstrap", required=True, help="HOST:PORT")
    member.add_argument("--group", required=True)
    member.add_argument("--topic", required=True)
    member.add_argument(
        "--client", choices=("aiokafka", "kafka-python", "confluent-kafka"), default="aiokafka"
    )
    member.add_argument("--session-timeout-ms", type=int, default=2000)
    member.add_argument("--heartbeat-interval-ms", type=int, default=300)

    follower = command("follower", "one follower process (serve starts it)")
    follower.add_argument("--broker-id", type=int, required=True)
    follower.add_argument("--leader", required=True, help="HOST:PORT")
    follower.add_argument("--fetch-wait-max-ms", type=int, default=200)
    follower.add_argument("--control-stdin", action="store_true", help="stop when stdin ends")

    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {args.command} %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kafka").setLevel(logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    with contextlib.suppress(KeyboardInterrupt):
        if args.command == "serve":
            sys.exit(asyncio.run(_serve(args)))
        elif args.command == "demo":
            from .demo import run_demo

            summary = asyncio.run(
                run_demo(
                    seed=args.seed,
                    seconds=args.seconds,
                    broker_log=args.broker_log,
                    metrics_port=args.metrics_port,
                    event_log=args.event_log,
                    event_log_interval=args.event_log_interval,
                )
            )
            if summary["lost"] or not summary["group_ok"]:
                sys.exit(1)
        elif args.command == "leader":
            config = BrokerConfig(
                port=args.port,
                broker_id=args.broker_id,
                follower_ids=args.followers,
                groups=GroupSettings(
                    initial_rebalance_delay_ms=args.group_initial_rebalance_delay_ms,
                    min_session_timeout_ms=args.group_min_session_timeout_ms,
                ),
                max_request_bytes=args.max_request_bytes,
                max_message_bytes=args.max_message_bytes,
                **_broker_settings(args),
            )
            sys.exit(asyncio.run(run_leader(config, control_stdin=args.control_stdin)))
        elif args.command == "member":
            from .member import MemberConfig, run_member

            member_config = MemberConfig(
                args.bootstrap,
                args.group,
                args.topic,
                session_timeout_ms=args.session_timeout_ms,
                heartbeat_interval_ms=args.heartbeat_interval_ms,
            )
            run_member(args.client, member_config)
        else:
            from .follower import run_follower

            host, _, port = args.leader.rpartition(":")
            asyncio.run(
                run_follower(
                    args.broker_id,
                    host,
                    int(port),
                    max_wait_ms=args.fetch_wait_max_ms,
                    control_stdin=args.control_stdin,
                )
            )


if __name__ == "__main__":
    main()
