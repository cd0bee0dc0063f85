"""airflow-resumable: long Airflow tasks that resume from their last checkpoint.

    from airflow_resumable import ResumableOperator, ChunkedOperator, RunContext

The operators import Airflow; the core (``airflow_resumable.core``) does not, so the names that
need Airflow are loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_resumable.core import (
    Cancelled,
    Checkpoint,
    ConfigurationError,
    CorruptCheckpoint,
    InvalidCheckpoint,
    LeaseBusy,
    LeaseLost,
    Reason,
    ResumableError,
    RunContext,
    SchemaVersionError,
    Signal,
    SkipLimitExceeded,
    Status,
    StoreUnavailable,
)
from airflow_resumable.version import __version__

#: The release, declared here only: setup.cfg reads it (`attr:`), and so does the provider info.

_LAZY = {
    "ResumableOperator": "airflow_resumable.operators.resumable",
    "ChunkedOperator": "airflow_resumable.operators.resumable",
    "ResumableHook": "airflow_resumable.hooks.resumable",
    "resumable_task": "airflow_resumable.decorators.resumable",
    "partitioned": "airflow_resumable.operators.partitioned",
}

if TYPE_CHECKING:
    from airflow_resumable.decorators.resumable import resumable_task
    from airflow_resumable.hooks.resumable import ResumableHook
    from airflow_resumable.operators.partitioned import partitioned
    from airflow_resumable.operators.resumable import ChunkedOperator, ResumableOperator


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'airflow_resumable' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Cancelled", "Checkpoint", "ChunkedOperator", "ConfigurationError", "CorruptCheckpoint",
    "InvalidCheckpoint", "LeaseBusy", "LeaseLost", "Reason", "ResumableError", "ResumableHook",
    "ResumableOperator", "RunContext", "SchemaVersionError", "Signal", "SkipLimitExceeded", "Status", "StoreUnavailable",
    "partitioned", "resumable_task", "__version__",
]
