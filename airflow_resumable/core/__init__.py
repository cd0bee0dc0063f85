"""The core: it never imports Airflow. Its folders, by role, from the ground up:

* ``model/``: the checkpoint row and its rules (values, tables, statuses, the requests' rules, errors, options);
* ``stores/``: the checkpoint stores (SQLite, PostgreSQL), their migrations, and in ``stores/transaction/``
  the connection as ``ctx.transaction()`` lends it (the handle, and the verdict on each statement sent through it);
* ``attempt/``: one attempt's life (acquire, run, after each chunk, finish) with its context, signal and lease;
* ``readers/``: where the chunk loop's items come from (keyset, file, sequence);
* ``work/``: the loops above one attempt (the chunk loop, partitioned jobs);
* ``control/``: the requests people make of a slot;
* ``view.py``: a row as it leaves the core (XCom, the task's return value, the task state store, the UI, REST, the CLI).
"""


from airflow_resumable.core import _moved
from airflow_resumable.core.attempt.context import RunContext
from airflow_resumable.core.attempt.runner import Attempt, Options, Outcome
from airflow_resumable.core.attempt.signal import Reason, Signal
from airflow_resumable.core.model.checkpoint import Checkpoint, Status
from airflow_resumable.core.model.errors import (
    AttemptEnded,
    Cancelled,
    ConfigurationError,
    CorruptCheckpoint,
    InvalidCheckpoint,
    LeaseBusy,
    LeaseLost,
    OverlapSkip,
    OverlapWait,
    Paused,
    RequestRefused,
    ResumableError,
    SchemaVersionError,
    SkipLimitExceeded,
    SlotNotFound,
    StoreUnavailable,
)
from airflow_resumable.core.readers import Batch, FileReader, KeysetReader, Reader, SequenceReader
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store
from airflow_resumable.core.stores.transaction.handle import TransactionConnection
from airflow_resumable.core.work.chunk_loop import chunk_loop

__all__ = [
    "Attempt", "AttemptEnded", "Batch", "Cancelled", "Checkpoint", "ConfigurationError", "CorruptCheckpoint",
    "FileReader", "InvalidCheckpoint", "KeysetReader", "LeaseBusy", "LeaseLost", "Options", "Outcome", "OverlapSkip",
    "OverlapWait", "Paused", "PostgresStore", "Reader", "Reason", "RequestRefused", "ResumableError", "RunContext",
    "SQLiteStore", "SchemaVersionError", "SequenceReader", "Signal", "SkipLimitExceeded", "SlotNotFound", "Status",
    "Store", "StoreUnavailable", "TransactionConnection", "chunk_loop",
]

_moved.install()  # the paths of the modules before 0.5.0, for one release
