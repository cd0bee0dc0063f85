"""A DAG whose handler misbehaves in its third chunk (``tests/support/escapes.py``), for
``tests/unit/core/stores/transaction/test_transaction_guard.py`` through dag.test(). conf: ``misdeed`` (a name of
``escapes.MISDEEDS``, or none). Its writes go to ``sink`` in the checkpoint database."""

from __future__ import annotations

import os
import sys
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, get_current_context

from airflow_resumable import ResumableOperator, RunContext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), ".."))

from support.escapes import handler  # noqa: E402


def misbehave(ctx: RunContext) -> Any:
    conf = dict(get_current_context()["dag_run"].conf or {})
    return handler(conf.get("misdeed"), swallow=False, report=ctx.log.info)(ctx)


with DAG("rt_guard", schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False) as rt_guard:
    ResumableOperator(task_id="work", handler=misbehave, retries=0)
