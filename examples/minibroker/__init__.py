"""A Kafka-protocol mini broker whose produce and fetch waits are parked in our purgatories.

A leader process and follower processes on loopback, speaking Kafka's wire protocol through
kafka-python's schema classes, so that unmodified Kafka clients (aiokafka, kafka-python) produce
and consume against it. ``acks=all`` produces wait in a `DelayedProduce` purgatory for the high
watermark, consumer long-polls in a `DelayedFetch` purgatory for ``min_bytes``, and followers'
fetches in a third one for new data. See ``python -m examples.minibroker --help`` and the README.

Modules, one job each: `protocol` (wire glue), `log` (a partition's batches), `replication`
(ISR and high watermark), `purgatories` (the delayed operations), `server` (the leader),
`follower`, `cluster` (starting the processes), `demo`.
"""
