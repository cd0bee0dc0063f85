"""Shared fixtures: a project-local Airflow home, PostgreSQL, and the checkpoint stores.

Airflow reads its configuration when first imported, so the environment is set here, at import
time, before any test module imports Airflow.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

if __name__ == "conftest" and "tests.conftest" in sys.modules:
    # pytest imported this file as tests.conftest; a second copy would make a second Airflow home
    # (with an empty dags folder) under the running session. Take its fixtures instead.
    raise ImportError("tests/conftest.py is pytest's: take its fixtures (load_dag, run_dag, ...) rather than importing it")

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from devtools import airflow_env  # noqa: E402

_HOME = Path(tempfile.mkdtemp(prefix="resumable-airflow-home-"))
_DAGS = _HOME / "dags"
airflow_env.apply(airflow_env.environment(_HOME, _DAGS, log_level=os.environ.get("AIRFLOW__LOGGING__LOGGING_LEVEL", "INFO")))
# dag.test() runs the resume trigger in line, in the task's own process: no scheduler to race, so a
# paused task may continue at once (the real-scheduler tests' standalone keeps the default).
os.environ["AIRFLOW__RESUMABLE__RESUME_SETTLE"] = "0"

from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store  # noqa: E402
from devtools.dags import DagFolder, only_file  # noqa: E402
from devtools.postgres import Server, dsn  # noqa: E402
from support.ci import in_ci  # noqa: E402
from support.sources import Source, source_of  # noqa: E402

# -- PostgreSQL ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Server]:
    """The PostgreSQL server (fails, never skips, when there is none)."""
    try:
        server = Server().start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def pg_params(pg_server: Server) -> dict[str, Any]:
    """libpq parameters of a fresh, empty schema (their ``options`` set its ``search_path``) in the
    session's shared database: a schema costs milliseconds, a database a third of a second."""
    return pg_server.create_schema()


@pytest.fixture
def pg_database(pg_server: Server) -> dict[str, Any]:
    """libpq parameters of a fresh, empty database of its own, for a test that needs more than a
    schema (one that reads counters or horizons the whole database shares)."""
    return pg_server.create_database()


# -- stores ---------------------------------------------------------------------------------------


#: Every checkpoint store; a test that takes ``store``/``checkpoints`` runs once on each.
STORE_KINDS = ("sqlite", "postgres")


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.hookimpl(tryfirst=True)  # before pytest parametrizes the fixture with its own params
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``@pytest.mark.one_store("why", kind="sqlite")`` runs a store-insensitive test on one store
    only (its assertions are about Airflow and the operator, not the store: the store contract
    suite proves the stores equal). The reason is required, and the module's docstring lists them.

    Raises:
        pytest.UsageError: the marker gives no reason or names no store.
    """
    marker = metafunc.definition.get_closest_marker("one_store")
    if marker is None or "store_kind" not in metafunc.fixturenames:
        return
    kind = marker.kwargs.get("kind", "sqlite")
    if not marker.args or not str(marker.args[0]).strip() or kind not in STORE_KINDS:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid}: one_store needs a reason and a kind of {STORE_KINDS}, "
            f"e.g. @pytest.mark.one_store('asserts the job key only', kind='sqlite')"
        )
    # As a parametrize mark (which pytest applies after this hook) it takes precedence over the
    # fixture's params; the test's id stays [sqlite] or [postgres].
    metafunc.definition.add_marker(pytest.mark.parametrize("store_kind", [kind], indirect=True))


@pytest.fixture
def store(store_kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A checkpoint store of each kind, empty."""
    if store_kind == "sqlite":
        return SQLiteStore(tmp_path / "checkpoints.db")
    params = request.getfixturevalue("pg_params")
    return PostgresStore(**params)


@pytest.fixture
def store_uri(store: Store, store_kind: str, request: pytest.FixtureRequest) -> str:
    """The Airflow connection URI of ``store``."""
    if store_kind == "sqlite":
        return f"sqlite:///{store.path}"  # type: ignore[attr-defined]
    return dsn(request.getfixturevalue("pg_params"))


@pytest.fixture
def source(store_kind: str, store: Store, request: pytest.FixtureRequest) -> Source:
    """A database to read from (the readers' tests): the store's own database, through its driver."""
    if store_kind == "sqlite":
        return source_of("sqlite", path=store.path)  # type: ignore[attr-defined]
    return source_of("postgres", pg_params=request.getfixturevalue("pg_params"))


# -- Airflow --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    """A migrated Airflow metadata DB (SQLite) and a dags folder with the example and test DAGs."""
    _DAGS.mkdir(parents=True, exist_ok=True)
    for folder in (ROOT / "dags", ROOT / "tests" / "dags"):
        for path in folder.glob("*.py"):
            link = _DAGS / path.name
            if not link.exists():
                link.symlink_to(path)
    result = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], capture_output=True, text=True, env=os.environ.copy()
    )
    if result.returncode != 0:
        pytest.fail(f"airflow db migrate failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}", pytrace=False)
    return _HOME


#: The DAG object with an id, from the dags folder.
_dags = DagFolder(_DAGS, "_resumable_dags_")
_load_dag = _dags.load


@pytest.fixture
def load_dag(airflow_home: Path) -> Callable[[str], Any]:
    """The DAG object with an id, from the session's dags folder (its module imported once)."""
    return _load_dag


@pytest.fixture
def checkpoints(store: Store, store_uri: str, monkeypatch: pytest.MonkeyPatch) -> Store:
    """Point the ``resumable_default`` connection at a fresh store of each kind."""
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", store_uri)
    return store


@pytest.fixture
def run_dag(airflow_home: Path):
    """Run a DAG with ``dag.test()``; returns the DagRun."""

    def run(dag_id: str, *, conf: dict[str, Any] | None = None, logical_date: Any = "default") -> Any:
        """``logical_date=None`` makes a run without one (as manual runs may be in Airflow 3)."""
        dag, path = _dags.find(dag_id)
        kwargs: dict[str, Any] = {"run_conf": conf or {}}
        if logical_date != "default":
            kwargs["logical_date"] = logical_date
        with only_file(path):
            return dag.test(**kwargs)

    return run


# -- markers --------------------------------------------------------------------------------------


#: The folders under tests/ and the marker each gives its tests (``-m unit``, ``-m "not integration"``).
FOLDER_MARKERS = ("unit", "integration", "system")
#: ``tests/unit/core/``'s marker: the core's tests (``-m core``).
CORE_FOLDER = ("unit", "core")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its folder (``unit``, ``integration``, ``system``; ``core`` too under
    ``tests/unit/core/``), and every test that
    needs PostgreSQL ``postgres``, so ``-m "not postgres"`` runs the rest without a server: those
    that use the server's fixtures, and the PostgreSQL half of the tests parametrized over both
    stores."""
    tests = ROOT / "tests"
    for item in items:
        path = Path(item.path)
        if path.is_relative_to(tests) and path.relative_to(tests).parts[0] in FOLDER_MARKERS:
            item.add_marker(path.relative_to(tests).parts[0])
            if path.relative_to(tests).parts[:2] == CORE_FOLDER:
                item.add_marker(pytest.mark.core)
        callspec = getattr(item, "callspec", None)
        on_postgres = callspec is not None and callspec.params.get("store_kind") == "postgres"
        if on_postgres or "pg_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


# -- skips in CI ----------------------------------------------------------------------------------


def ci_allowed_skips() -> frozenset[str]:
    """The skip reasons CI accepts, exactly: the Airflow-version gates of ``tests/support/gates.py``
    as they read on the installed Airflow. A feature of a newer Airflow skips its tests where it is
    missing (:func:`support.gates.needs_airflow`, the reason :func:`~airflow_resumable.version_compat.needs`
    gives), and a test of the way an older Airflow does without it skips where it is there
    (:func:`support.gates.before_airflow`); the matrix (``make matrix``) runs on Airflow 3.1 and 3.2
    too, where the first kind skips. Nothing else may skip in CI: a missing database, tool or
    kernel feature fails there (the fixture that needs it may still skip on a developer's machine,
    saying how to install it)."""
    from support.gates import gate_reasons

    return gate_reasons()


#: Where a skip's reason is read from: pytest's own prefix on ``pytest.skip``'s message.
_SKIPPED_PREFIX = re.compile(r"^Skipped: ")


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return _SKIPPED_PREFIX.sub("", str(longrepr[2]))
    return _SKIPPED_PREFIX.sub("", str(longrepr))


def _fail_a_skip_in_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Under ``CI=true``, a skip whose reason is not one of :func:`ci_allowed_skips` becomes a
    failure that says why (an xfail is pytest's to judge, strictly: setup.cfg's ``xfail_strict``)."""
    if not report.skipped or hasattr(report, "wasxfail") or not in_ci():
        return
    reason = _skip_reason(report)
    if reason in ci_allowed_skips():
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped under CI=true, which fails every skip but the Airflow-version gates of "
        f"tests/support/gates.py (docs/contributing.md): {reason}"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None],
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _fail_a_skip_in_ci(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    _fail_a_skip_in_ci(report)
    return report
