"""Benchmarks of purgatory against hand-written asyncio baselines (see ``baselines``).

Run ``python -m benchmarks`` (``--help`` for the options). Modules, one job each:

- ``__main__``: the command line; runs the workloads, writes JSON, RESULTS.md and the plot.
- ``config``: the full and quick run parameters.
- ``contenders``: who runs in each workload and on which loop.
- ``ours``: purgatory through its public API (a flag-checking DelayedOperation subclass).
- ``baselines``: A (Future + call_later + dict of lists; B is A on uvloop), A-lean (a tuple of
  threshold, Future and ``call_at`` handle per request, no class), C (a Task per request with
  ``wait_for``) and the Floor (create the object, insert it into one dict per key).
- ``loops``: the asyncio and uvloop loop factories; a fresh loop per measurement.
- ``w1``: Kafka's TestPurgatoryPerformance, asyncio edition (rate search, confirmation);
  W1-force, W1-key and W1-threshold.
- ``w2``: N pending at once (schedule, complete, expire costs; memory; lateness).
- ``measure``: quantiles, medians, CPU/wall stopwatches, GC pause accounting.
- ``environment``: Python, machine, load and git provenance.
- ``report`` / ``plot``: Markdown tables and the W2 figure, from the JSON alone.
- ``profile``: cProfile of our hot paths (W1-key or W1-threshold, and W2), for optimisation work.
- ``breakdown``: the schedule path step by step at N pending, and W1's purgatory work per request
  (force, key, threshold) in a steady state without the driver.
- ``merge``: fold a partial run (``--merge``) into the earlier results JSON.

Everything is seeded; every figure is a median over repetitions after a warm-up, reported with
its ratio to the baselines measured in the same run (absolute times drift on a shared machine).
"""
