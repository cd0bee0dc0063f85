"""What the tests of ctx.transaction()'s guard share (tests/unit/core/stores/transaction/): the
guarded slot, the drivers each test runs on, the slot's row, a first attempt in a process of its own
that does a misdeed (``escape_worker.py``) and a second one here that behaves.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from airflow_resumable.core import Attempt
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import Store
from support.escapes import handler
from support.paths import SUPPORT
from support.stores import spec_of

WORKER = SUPPORT / "escape_worker.py"
JOB, SLOT = "guard", "2026-01-01T00:00:00+00:00"
PG = pytest.mark.postgres
ALL = ("sqlite", "psycopg2", "psycopg3")


def _drivers(*kinds: str) -> list[Any]:
    return [pytest.param(k, marks=PG) if k != "sqlite" else k for k in kinds]


def _row(store: Store) -> Any:
    with store.open() as s:
        return s.checkpoints.load(JOB, SLOT)


def _attempt(store: Store, misdeed: str, then: str) -> subprocess.CompletedProcess[str]:
    """Attempt 1, in its own process."""
    return subprocess.run([sys.executable, str(WORKER), spec_of(store), JOB, SLOT, misdeed, then, "1"],
                          capture_output=True, text=True, timeout=120)


def _resume(store: Store) -> Any:
    """Attempt 2, here, with a handler that behaves."""
    return Attempt(store, Identity(job=JOB, slot=SLOT, attempt=2, owner="a2")).run(handler(None, report=lambda _: None))
