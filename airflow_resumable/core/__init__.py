"""The core: checkpoint model, signal, chunk loop, lease, stores. It never imports Airflow."""

from airflow_resumable.core.checkpoint import Checkpoint, Status
from airflow_resumable.core.chunked import chunk_loop
from airflow_resumable.core.context import RunContext
from airflow_resumable.core.errors import (
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
from airflow_resumable.core.lent import TransactionConnection
from airflow_resumable.core.readers import Batch, FileReader, KeysetReader, Reader, SequenceReader
from airflow_resumable.core.runner import Attempt, Options, Outcome
from airflow_resumable.core.signal import Reason, Signal
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store

__all__ = [
    "Attempt", "AttemptEnded", "Batch", "Cancelled", "Checkpoint", "ConfigurationError", "CorruptCheckpoint",
    "FileReader", "InvalidCheckpoint", "KeysetReader", "LeaseBusy", "LeaseLost", "Options", "Outcome", "OverlapSkip",
    "OverlapWait", "Paused", "PostgresStore", "Reader", "Reason", "RequestRefused", "ResumableError", "RunContext",
    "SQLiteStore", "SchemaVersionError", "SequenceReader", "Signal", "SkipLimitExceeded", "SlotNotFound", "Status",
    "Store", "StoreUnavailable", "TransactionConnection", "chunk_loop",
]
