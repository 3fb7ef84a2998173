"""A Kafka-protocol mini broker whose waits are parked in our purgatories.

A leader process and follower processes on loopback, speaking Kafka's wire protocol through
kafka-python's schema classes, so that unmodified Kafka clients (aiokafka, kafka-python,
confluent-kafka) produce, consume and form consumer groups against it. ``acks=all`` produces
wait in a `DelayedProduce` purgatory for the high watermark, consumer long-polls in a
`DelayedFetch` purgatory for ``min_bytes``, followers' fetches in a third one for new data; a
group's rebalance waits in a `DelayedJoin` and each member's session is a `DelayedHeartbeat`, in
two more. See ``python -m examples.minibroker --help``, the README and the docs' broker page.

Modules, one job each, as Kafka's broker is split: `network` (connections, framing, answers in
order: SocketServer), `apis` (one handler per API: KafkaApis), `replica_manager` (partitions and
their purgatories: ReplicaManager), `replication` (ISR and high watermark: Partition), `log` (a
partition's batches), `purgatories` (DelayedProduce, DelayedFetch), `coordinator` and `group`
(consumer groups: GroupCoordinator, GroupMetadata), `stats`, `server` (the wiring), `protocol`
(wire glue); `follower`, `member`, `cluster` (starting the processes), `demo`.
"""
