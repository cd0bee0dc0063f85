"""A test kit for your own handlers: prove they resume.

``check_resumable(handler, snapshot=..., reset=...)`` runs a handler on an embedded store
interrupted at its chunk boundaries in turn (every one, or a seeded sample of a long run's), by
every kind of interruption the product knows (a crash before and after the checkpoint, a process
killed and the run resumed in a new one, a cancel, a timeout, a lost lease, a pause and resume, a
pipelined write lost in flight), resuming each time until done, and compares each run with an
uninterrupted one: the returned value, the final state and your sink. ``check_chunked(read,
process, chunk_size=...)`` does the same for a ``ChunkedOperator``'s functions, and
``check_partitioned(read, process, partitions=..., chunk_size=...)`` for each partition of a
partitioned job. ``store=`` runs them on PostgreSQL too (a URL, or a store).

The pytest plugin (:mod:`airflow_resumable.testing.plugin`, registered by entry point) adds the
fixtures ``resumable_store``, ``resumable_check`` and ``resumable_dag_test``.
"""

from airflow_resumable.testing.kit import (
    ALL_INTERRUPTIONS,
    IN_PROCESS_INTERRUPTIONS,
    Interruption,
    NotImportable,
    NotResumable,
    PartitionedReport,
    Report,
    SimulatedCrash,
    Trial,
    check_chunked,
    check_partitioned,
    check_resumable,
    expire_lease,
    store_of,
)
from airflow_resumable.testing.splits import SplitStep

__all__ = [
    "ALL_INTERRUPTIONS", "IN_PROCESS_INTERRUPTIONS", "Interruption", "NotImportable", "NotResumable",
    "PartitionedReport", "Report", "SimulatedCrash", "SplitStep", "Trial", "check_chunked", "check_partitioned",
    "check_resumable",
    "expire_lease", "store_of",
]
