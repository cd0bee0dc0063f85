"""The test kit's pytest plugin, registered by the ``pytest11`` entry point (installing the
package is enough; ``-p no:resumable`` turns it off).

Option: ``--resumable-store URL`` (or the ini key ``resumable_store``): the checkpoint store the
fixtures use, e.g. ``postgresql://postgres@127.0.0.1:5432/test``, to prove handlers on PostgreSQL
as well as on the embedded default (see :func:`~airflow_resumable.testing.store_of`).

Fixtures:

``resumable_store``
    A throwaway embedded checkpoint store (SQLite, in the test's ``tmp_path``); with
    ``--resumable-store``, that store (its schema created; the kit deletes only its own slot).
``resumable_check``
    :func:`~airflow_resumable.testing.check_resumable`, asserting: ``resumable_check(handler,
    snapshot=..., reset=...)`` fails the test with the first interruption that changes the outcome,
    and returns the :class:`~airflow_resumable.testing.Report` otherwise. With
    ``--resumable-store`` its runs use that store unless the call gives ``store=``.
``resumable_dag_test``
    ``resumable_dag_test(dag, task_id, interruption, at=n)``: run ``dag.test()`` with the task's
    attempt interrupted at its ``n``-th checkpoint, then again (as a Clear does) until the run
    succeeds; returns the last DagRun. Needs Airflow (an Airflow home with a metadata database, as
    any ``dag.test()`` does) and the ``resumable_default`` connection (or the operator's
    ``conn_id``) pointing at a store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core.stores import SQLiteStore, Store
from airflow_resumable.testing.kit import (
    Interruption,
    Report,
    _Plan,
    check_resumable,
    interrupted_attempt,
    store_of,
)

_STORE_HELP = ("the checkpoint store of the test kit's fixtures: postgresql://user@host:5432/db or "
               "sqlite:////absolute/path.db (default: a new SQLite file per test)")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("resumable", "airflow-resumable's test kit").addoption(
        "--resumable-store", default=None, metavar="URL", help=_STORE_HELP)
    parser.addini("resumable_store", _STORE_HELP, default=None)


def _configured(config: pytest.Config) -> str | None:
    return config.getoption("--resumable-store") or config.getini("resumable_store") or None


@pytest.fixture
def resumable_store(tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    """A fresh embedded checkpoint store for this test, or the ``--resumable-store`` one."""
    url = _configured(request.config)
    if url is None:
        return SQLiteStore(tmp_path / "resumable-checkpoints.db")
    store = store_of(url)
    with store.open(autocommit=True) as session:
        session.ensure_schema()
    return store


@pytest.fixture
def resumable_check(request: pytest.FixtureRequest) -> Callable[..., Report]:
    """``check_resumable`` that fails the test when the handler is not resumable."""
    url = _configured(request.config)

    def check(handler: Callable[..., Any], **kwargs: Any) -> Report:
        if url is not None:
            kwargs.setdefault("store", url)
        return check_resumable(handler, **kwargs).assert_ok()

    return check


@pytest.fixture
def resumable_dag_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """Run a DAG with ``dag.test()``, one resumable task interrupted at one checkpoint."""

    def run(dag: Any, task_id: str, interruption: Interruption | str, *, at: int = 1, max_runs: int = 5,
            **test_kwargs: Any) -> Any:
        from airflow_resumable.operators import resumable as operator_module
        from airflow_resumable.version_compat import environment_problems

        kind = Interruption(interruption)
        if kind is Interruption.PROCESS_DEATH:
            pytest.fail("process_death kills the attempt's process and resumes in a new one, and dag.test() runs the "
                        "task in this test's process: prove the handler with resumable_check (or check_resumable), "
                        "or crash_after_checkpoint here", pytrace=False)
        for problem in environment_problems():  # dag.test() would only answer 500s
            pytest.fail(problem, pytrace=False)
        plan = _Plan(kind=kind, point=at)
        base = operator_module.Attempt
        job_prefix = f"{dag.dag_id}.{task_id}"
        interrupted = interrupted_attempt(plan, base=base)

        def attempt_for(store: Any, identity: Any, **kwargs: Any) -> Any:
            # Only the chosen task's attempts are interrupted (its job, or its mapped partitions).
            chosen = identity.job == job_prefix or identity.job.startswith(job_prefix + "[")
            cls = interrupted if chosen and not plan.struck else base
            return cls(store, identity, **kwargs)

        monkeypatch.setattr(operator_module, "Attempt", attempt_for)
        try:
            last = None
            for _ in range(max_runs):
                last = dag.test(**test_kwargs)
                if str(last.state) == "success" and plan.struck:
                    return last
                if str(last.state) == "success":
                    raise AssertionError(
                        f"{job_prefix} finished without reaching checkpoint {at}: it made {plan.calls}; "
                        "choose an earlier point")
            raise AssertionError(f"{job_prefix} did not succeed in {max_runs} runs after {kind.value} at "
                                 f"checkpoint {at}; the last run ended {last.state if last else None}")
        finally:
            monkeypatch.setattr(operator_module, "Attempt", base)

    yield run
