"""purgatory's benchmark suite: ``python -m benchmarks`` (``--help`` lists every workload).

One entry point runs the workloads of one manifest (``workloads``), all or those ``--only``
names, and writes one results file of one commit, every figure with its spread; ``python -m
benchmarks compare A.json B.json`` shows two runs side by side, ``python -m benchmarks report``
renders one (``RESULTS.md`` is the rendering of ``results.json``). Every timing goes through
``measure``: pyperf for the microbenchmarks of ``micro`` and ``eventlog``, stopwatches for the
open-loop workloads (``w1``, ``w2``, ``parked``, ``idle``, ``expiry_rate``) on a real loop.
``contenders`` says who runs where: ``ours`` (purgatory through its public API, and the suite's
one operation class, on asyncio and on uvloop) and the ``baselines``, each compared with ours on
its loop. Everything is seeded; baselines run in the same process run as ours, and the report
gives ratios to them (absolute times drift on a shared machine).
"""
