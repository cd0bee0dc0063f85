"""A temporary Airflow home for the rows that run real tasks (3 and 7) with ``dag.test()``.

Airflow reads its configuration when first imported, so :func:`configure` runs before anything
imports Airflow. The metadata database is SQLite in the temporary home (``dag.test()``'s usual
setup; a PostgreSQL metadata database would also need the ``asyncpg`` driver, which this
environment does not install). The dags folder is ``bench/dags``; the checkpoint store of the
operators is the connection ``resumable_default``, pointed at the benchmark's PostgreSQL database
(or a SQLite file) per run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from devtools import airflow_env as env

DAGS = Path(__file__).resolve().parent / "dags"

_home: Path | None = None
_migrated = False
_folder: Any = None


def configure() -> Path:
    """Set the environment of a fresh Airflow home (idempotent). Call before importing Airflow."""
    global _home
    if _home is None:
        _home = Path(tempfile.mkdtemp(prefix="resumable-bench-airflow-"))
        # Task logs cost the same on both sides of every comparison; keep them out of the output.
        level = os.environ.get("BENCH_AIRFLOW_LOG_LEVEL", "ERROR")
        env.apply(env.environment(_home, DAGS, log_level=level))
    return _home


def migrate() -> None:
    """``airflow db migrate`` in a subprocess, once."""
    global _migrated
    if _migrated:
        return
    configure()
    result = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], capture_output=True, text=True, env=os.environ.copy()
    )
    if result.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    _migrated = True


def load_dag(dag_id: str) -> Any:
    """The DAG object with this id, from ``bench/dags`` (each file loaded once)."""
    global _folder
    if _folder is None:
        from devtools.dags import DagFolder

        _folder = DagFolder(DAGS, "_bench_dags_")
    return _folder.load(dag_id)


def state(dag_run: Any) -> str:
    return str(getattr(dag_run, "state", "")).rsplit(".", 1)[-1].lower()


def cleanup() -> None:
    if _home is not None:
        shutil.rmtree(_home, ignore_errors=True)


def run_dag(dag_id: str, logical_date: Any) -> tuple[Any, float, float | None]:
    """Run one DAG run with ``dag.test()``: (dag run, wall seconds, the task's recorded duration).

    Fails when the run does not succeed (a benchmark of a failing task measures nothing).
    """
    import time

    from airflow import settings
    from airflow.models.taskinstance import TaskInstance

    dag = load_dag(dag_id)
    start = time.perf_counter()
    dag_run = dag.test(logical_date=logical_date)
    wall = time.perf_counter() - start
    if state(dag_run) != "success":
        raise RuntimeError(f"dag.test() of {dag_id} ended {state(dag_run)!r}; rerun with BENCH_AIRFLOW_LOG_LEVEL=INFO")
    session = settings.Session()
    try:
        tis = session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=dag_run.run_id).all()
        duration = sum(ti.duration or 0.0 for ti in tis) if tis else None
    finally:
        session.close()
    return dag_run, wall, duration
