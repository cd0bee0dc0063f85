"""Benchmarks for airflow-resumable: ``python -m bench`` (or ``make bench``).

Every figure is a *ratio* of two things measured side by side in the same run, alternating in
rounds, and summarized by the median of the per-round ratios with their spread (IQR): the
machines these run on are shared and noisy, so absolute times move from run to run while ratios
measured together hold. Beside them, figures that do not move with the neighbours' load: CPU time
of this process (2i), instructions counted by cachegrind (2j), round trips counted at the driver
(2k). One table is printed at the end, one row per figure, each with its target and PASS / MISS.

Rows (one module each):

1. :mod:`bench.commit` -- a checkpoint save (fenced by the lease) vs a bare upsert + commit.
2. :mod:`bench.loans` -- the loan report over 1,000,000 rows vs the seed's OFFSET loop and a bare
   keyset loop.
3. :mod:`bench.native` -- Airflow 3.3's task state store vs our operator inside real task runs.
4. :mod:`bench.cancel` -- cancellation latency, SIGTERM to stopped, against the chunk duration.
5. :mod:`bench.heartbeat` -- lease renewals while the handler burns CPU for 10 lease durations.
6. :mod:`bench.scale` -- lookups on a checkpoint table of 1,000,000 rows across 1,000 jobs.
7. :mod:`bench.overhead` -- our operator vs a plain ``PythonOperator`` doing the same work, and
   vs the same task with hand-written checkpoints and reports (its floors, 7b and 7c).
16. :mod:`bench.items` -- the chunk loop's own instructions per item (2j, cachegrind).

:mod:`bench.profile` times an attempt's parts (connect, schema probe, lease, start, checkpoints,
order check, finish, XCom...) for the notes of rows 2 and 7; ``python -m bench.cprofile_report`` adds a
cProfile listing.

Only this package (and its ``dags/`` folder) is benchmark code; nothing here is imported by the
provider.
"""
