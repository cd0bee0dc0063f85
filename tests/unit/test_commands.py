"""``airflow resumable ...``: each command through Airflow's own CLI parser (the provider's ``cli``
entry), and one real ``airflow`` subprocess; the same commands under ``python -m airflow_resumable``,
which is where they are on an Airflow without provider CLI commands (3.1: there the Airflow parser's
tests are skipped, saying so)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import SQLiteStore, Store
from airflow_resumable.core.work.partitions import Plan, save_plan
from support.gates import before_airflow, needs_airflow, skip_unless
from support.module_cli import module_cli
from support.slots import SLOT, run_slot
from support.stores import empty_store

A, B = "dag_a.export", "dag_b.export"
#: Airflow's parser has the group from Airflow 3.2 on (provider CLI commands).
GROUP = "airflow resumable ... (provider CLI commands)"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    s = SQLiteStore(tmp_path / "checkpoints.db")
    run_slot(s, A, "dag_a", fail_at=10)
    run_slot(s, B, "dag_b")
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", f"sqlite:///{s.path}")
    return s


@pytest.fixture
def any_store(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Store:
    """The same two slots as ``store``, on each kind of store."""
    s, uri = empty_store(store_kind, tmp_path, request)
    run_slot(s, A, "dag_a", fail_at=10)
    run_slot(s, B, "dag_b")
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", uri)
    return s


@pytest.fixture(scope="module")
def parser() -> Any:
    skip_unless(GROUP)
    from airflow.cli import cli_parser

    return cli_parser.get_parser()


def cli(parser: Any, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``airflow <argv>`` in this process: (exit status, stdout, stderr)."""
    args = parser.parse_args(list(argv))
    try:
        args.func(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_shows_the_slots_most_recent_first_as_json(store: Store, parser: Any, capsys: Any) -> None:
    code, out, _ = cli(parser, capsys, "resumable", "list", "--output", "json")
    rows = json.loads(out)
    assert code == 0 and [r["job"] for r in rows] == [B, A]
    assert (rows[1]["status"], rows[1]["processed"], rows[1]["total"]) == ("failed", 10, 30)


def test_list_filters_by_dag_and_status_and_prints_a_table(store: Store, parser: Any, capsys: Any) -> None:
    code, out, _ = cli(parser, capsys, "resumable", "list", "--dag-id", "dag_a", "--status", "failed")
    assert code == 0 and A in out and B not in out and "33.33" in out
    code, out, _ = cli(parser, capsys, "resumable", "list", "--status", "paused", "--output", "json")
    assert json.loads(out) == []


def test_show_prints_the_row_its_figures_and_what_it_would_take(store: Store, parser: Any, capsys: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    connections: list[int] = []
    connect = SQLiteStore.connect
    monkeypatch.setattr(SQLiteStore, "connect", lambda self, **kw: connections.append(1) or connect(self, **kw))
    code, out, _ = cli(parser, capsys, "resumable", "show", A, SLOT, "--output", "json")
    view = json.loads(out)
    assert code == 0 and (view["status"], view["position"], view["lease"]) == ("failed", 10, "none")
    assert view["offers"]["pause"] and not view["offers"]["cancel"]
    # read on one connection, with the fields show has always printed (the REST detail's extras left out)
    assert len(connections) == 1 and [h["outcome"] for h in view["history"]] == ["failed"]
    assert "offer_notes" not in view and "skipped_items" not in view
    code, out, _ = cli(parser, capsys, "resumable", "show", A, SLOT)
    assert code == 0 and "pause, restart" in out


def test_show_of_an_unknown_slot_exits_1_naming_it(store: Store, parser: Any, capsys: Any) -> None:
    code, out, err = cli(parser, capsys, "resumable", "show", "nope", SLOT)
    assert code == 1 and "no checkpoint row for this slot" in err and "'nope'" in err


def test_history_lists_attempts_and_requests(store: Store, parser: Any, capsys: Any) -> None:
    cli(parser, capsys, "resumable", "pause", A, SLOT, "--by", "ops")
    code, out, _ = cli(parser, capsys, "resumable", "history", A, SLOT, "--output", "json")
    assert code == 0 and [(r["outcome"], r["requested_by"]) for r in json.loads(out)] == [
        ("failed", None), ("pause_requested", "ops")]


def test_pause_and_resume_record_who_asked_defaulting_to_the_os_user(store: Store, parser: Any, capsys: Any) -> None:
    from airflow_resumable.core.control.requests import default_by

    code, out, _ = cli(parser, capsys, "resumable", "pause", A, SLOT, "--output", "json")
    assert code == 0 and json.loads(out)["request"] == "pause" and json.loads(out)["requested_by"] == default_by()
    code, out, _ = cli(parser, capsys, "resumable", "resume", A, SLOT, "--by", "bob", "--output", "json")
    assert code == 0 and (json.loads(out)["request"], json.loads(out)["requested_by"]) == ("resume", "bob")


def test_cancel_of_a_finished_slot_is_refused_saying_why(store: Store, parser: Any, capsys: Any) -> None:
    code, _, err = cli(parser, capsys, "resumable", "cancel", B, SLOT)
    assert code == 1 and "the slot finished (done): there is nothing to cancel" in err and "restart" in err


def test_restart_marks_the_next_attempt_to_start_over(store: Store, parser: Any, capsys: Any) -> None:
    code, out, _ = cli(parser, capsys, "resumable", "restart", B, SLOT, "--by", "ops", "--output", "json")
    assert code == 0 and json.loads(out)["request"] == "restart"


def test_release_without_a_holder_is_refused_even_with_force(store: Store, parser: Any, capsys: Any) -> None:
    code, _, err = cli(parser, capsys, "resumable", "release", A, SLOT, "--force")
    assert code == 1 and "nobody holds the slot's lease" in err


def test_migrate_reports_the_schema(store: Store, parser: Any, capsys: Any) -> None:
    from airflow_resumable.core.stores.migrations import SCHEMA_VERSION

    code, out, _ = cli(parser, capsys, "resumable", "migrate", "--check")
    assert code == 0 and f"schema {SCHEMA_VERSION}, this code needs {SCHEMA_VERSION}" in out
    code, out, _ = cli(parser, capsys, "resumable", "migrate")
    assert code == 0 and "nothing to do" in out


def test_a_missing_connection_says_how_to_configure_it(store: Store, parser: Any, capsys: Any) -> None:
    code, _, err = cli(parser, capsys, "resumable", "list", "--conn-id", "no_such_conn")
    assert code == 1 and "AIRFLOW_CONN_NO_SUCH_CONN" in err


@needs_airflow(GROUP)
def test_the_airflow_command_line_has_the_group(store: Store, airflow_home: Path) -> None:
    airflow = Path(sys.executable).parent / "airflow"
    result = subprocess.run([str(airflow), "resumable", "list", "--output", "json"], capture_output=True, text=True,
                            env=os.environ.copy(), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [r["job"] for r in json.loads(result.stdout.strip().splitlines()[-1])] == [B, A]


def test_each_requests_help_says_which_slots_take_it_from_the_rules_table(parser: Any, capsys: Any) -> None:
    from airflow_resumable.core.model.request_rules import Action, taken_when

    for action in Action:
        with pytest.raises(SystemExit):
            parser.parse_args(["resumable", action.value, "--help"])
        out = " ".join(capsys.readouterr().out.split())  # argparse wraps the description
        assert taken_when(action) in out, action
        assert ("--force" in out) is (action is Action.RELEASE), action


def test_clean_removes_finished_slots_past_an_age(store: Store, parser: Any, capsys: Any) -> None:
    code, out, _ = cli(parser, capsys, "resumable", "clean", "--older-than", "1h", "--dry-run")
    assert code == 0 and "would remove 0 finished slot(s)" in out


# -- numeric options ---------------------------------------------------------------------------------

_NOT_COUNTS = ("-1", "0", "1000001", "99999999999999999999", "9" * 5000, "nan", "inf", "-inf", "1.5", "ten")
_NOT_AGES = ("0", "0s", "-1d", "99999999999999w", "36501d", "9" * 400, "nan", "inf", "1e3", "30x")

#: (command line, the option, what the message says is allowed) for every numeric option. Values
#: as ``--option=value``: argparse takes a separate "-1d" or "-inf" for an option of its own.
_OUT_OF_RANGE = [
    *((("resumable", "list", f"--limit={v}"), "--limit", "from 1 to 1,000,000") for v in _NOT_COUNTS),
    *((("resumable", "clean", "--older-than", "1d", f"--batch={v}"), "--batch", "from 1 to 1,000,000")
      for v in _NOT_COUNTS),
    *((("resumable", "clean", f"--older-than={v}"), "--older-than", "from 1s to 36500d") for v in _NOT_AGES),
]


def refused(parse: Any, capsys: pytest.CaptureFixture[str], argv: Sequence[str]) -> tuple[Any, str]:
    """Parse ``argv`` expecting argparse to refuse it: (exit status, stderr)."""
    with pytest.raises(SystemExit) as exited:
        parse(list(argv))
    return exited.value.code, capsys.readouterr().err


@pytest.mark.parametrize(("argv", "option", "allowed"), _OUT_OF_RANGE, ids=lambda v: " ".join(v)[:60]
                         if isinstance(v, tuple) else None)
def test_a_numeric_option_out_of_range_is_refused_like_argparse_naming_it_and_the_range(
    parser: Any, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], option: str, allowed: str
) -> None:
    code, err = refused(parser.parse_args, capsys, argv)
    # Airflow's parser words it "airflow resumable list command error: argument --limit: ..."
    assert code == 2 and f"airflow resumable {argv[1]} command error: argument {option}: " in err, err
    assert allowed in err and "Traceback" not in err


@pytest.mark.parametrize(("argv", "option", "allowed"), [c for c in _OUT_OF_RANGE if c[0][1] == "clean"],
                         ids=lambda v: " ".join(v)[:60] if isinstance(v, tuple) else None)
def test_python_m_airflow_resumable_refuses_the_same_options_the_same_way(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], option: str, allowed: str
) -> None:
    from airflow_resumable.cli import main

    code, err = refused(main, capsys, ["clean", "--url", "sqlite:////nonexistent/x.db", *argv[2:]])
    assert code == 2 and f"clean: error: argument {option}: " in err and allowed in err, err


def test_the_largest_allowed_values_work_on_both_stores(any_store: Store, parser: Any, capsys: Any) -> None:
    # Given both slots are finished (done, failed) and were written just now
    # When clean is asked for slots older than the largest allowed age, in the largest batch
    code, out, err = cli(parser, capsys, "resumable", "clean", "--older-than", "36500d", "--batch", "1000000")
    # Then it removes nothing, and says so
    assert (code, err) == (0, "") and "removed 0 finished slot(s)" in out
    code, out, err = cli(parser, capsys, "resumable", "list", "--limit", "1000000", "--output", "json")
    assert (code, err) == (0, "") and [r["job"] for r in json.loads(out)] == [B, A]
    code, out, err = cli(parser, capsys, "resumable", "list", "--limit", "1", "--output", "json")
    assert (code, err) == (0, "") and [r["job"] for r in json.loads(out)] == [B]


def test_list_leaves_a_partitioned_jobs_plan_row_out_unless_asked_and_then_marks_it_on_both_stores(
    any_store: Store, parser: Any, capsys: Any
) -> None:
    # Given a partitioned job's plan stored on its slot (<job>#plan) beside the two slots
    with any_store.open(autocommit=True) as s:
        save_plan(s, "dag_p.export", SLOT, Plan(2, (10,), 20))
    # When the slots are listed: the plan is not among them (it is the job's split, not work)
    code, out, _ = cli(parser, capsys, "resumable", "list", "--output", "json")
    assert code == 0 and [r["job"] for r in json.loads(out)] == [B, A]
    assert {r["kind"] for r in json.loads(out)} == {"slot"}
    # When they are listed with --include-plans: the plan row comes, marked as one
    code, out, _ = cli(parser, capsys, "resumable", "list", "--include-plans", "--output", "json")
    rows = {r["job"]: r for r in json.loads(out)}
    assert code == 0 and set(rows) == {A, B, "dag_p.export#plan"}
    assert (rows["dag_p.export#plan"]["kind"], rows[A]["kind"]) == ("plan", "slot")
    # And the table says which is which in its first column
    code, out, _ = cli(parser, capsys, "resumable", "list", "--include-plans", "--output", "plain")
    line = next(ln for ln in out.splitlines() if "dag_p.export#plan" in ln)
    assert code == 0 and line.split()[0] == "plan" and "kind" in out.splitlines()[0]
    # And --limit counts only what is listed
    code, out, _ = cli(parser, capsys, "resumable", "list", "--limit", "2", "--output", "json")
    assert [r["job"] for r in json.loads(out)] == [B, A]


@pytest.fixture
def client_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command line that has not said it is a server (Airflow then reads no connection from the
    metadata database); the variable is restored after the test."""
    monkeypatch.setenv("_AIRFLOW_PROCESS_CONTEXT", "")


@pytest.mark.parametrize("argv", [("resumable", "list", "--output", "json"), ("resumable", "migrate", "--check")])
def test_a_connection_kept_in_the_metadata_database_is_found(
    argv: tuple[str, ...], tmp_path: Path, airflow_home: Path, parser: Any, capsys: Any, client_context: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given a connection added in the UI or with ``airflow connections add`` (the metadata database
    only, nothing in the environment), the commands find it, as ``airflow connections get`` does."""
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    s = SQLiteStore(tmp_path / "checkpoints.db")
    run_slot(s, A, "dag_a")
    conn_id = f"resumable_db_{tmp_path.name[-20:]}"
    monkeypatch.delenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", raising=False)
    with create_session() as session:
        session.add(Connection(conn_id=conn_id, uri=f"sqlite:///{s.path}"))
    try:
        code, out, err = cli(parser, capsys, *argv, "--conn-id", conn_id)
    finally:
        with create_session() as session:
            session.query(Connection).filter(Connection.conn_id == conn_id).delete()
    assert code == 0, err
    assert A in out if argv[1] == "list" else "schema" in out


# -- python -m airflow_resumable: the same commands, on every supported Airflow ---------------------


def test_python_m_airflow_resumable_lists_shows_and_steers_slots_as_airflow_resumable_does(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given two slots in the default connection's store
    # When they are listed, one is shown and paused, and a finished one is cancelled
    code, out, _ = module_cli(capsys, "list", "--output", "json")
    # Then the module's command line answers as the Airflow group does, from the same definitions
    assert code == 0 and [r["job"] for r in json.loads(out)] == [B, A]
    code, out, _ = module_cli(capsys, "show", A, SLOT, "--output", "json")
    assert code == 0 and json.loads(out)["status"] == "failed"
    code, out, _ = module_cli(capsys, "pause", A, SLOT, "--by", "carol", "--output", "json")
    assert code == 0 and (json.loads(out)["request"], json.loads(out)["requested_by"]) == ("pause", "carol")
    code, _, err = module_cli(capsys, "cancel", B, SLOT)
    assert code == 1 and "the slot finished (done): there is nothing to cancel" in err


def test_python_m_airflow_resumable_runs_the_commands_in_a_real_process(store: Store, airflow_home: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "airflow_resumable", "list", "--output", "json"],
                            capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [r["job"] for r in json.loads(result.stdout.strip().splitlines()[-1])] == [B, A]


@before_airflow(GROUP)
def test_on_an_airflow_without_provider_commands_the_help_says_where_they_are(
    capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = module_cli(capsys, "--help")
    text = " ".join(out.split())
    assert code == 0 and "needs Airflow 3.2 or later" in text and "python -m airflow_resumable" in text


@pytest.mark.parametrize("command", ["", "list", "show", "pause", "jobs", "rerun-failed", "migrate", "clean",
                                     "skipped retry"])
def test_python_m_airflow_resumable_help_reads_as_plain_words_without_rest_markup(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = module_cli(capsys, *command.split(), "--help")
    assert code == 0 and out
    for markup in ("``", ":func:", ":class:", ":data:", ":meth:", ":mod:"):
        assert markup not in out, (command, markup, out)


def test_cli_tables_keep_job_names_and_run_ids_whole_however_narrow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table wider than the terminal wraps its cells between words or runs past the edge, but
    never splits a job name, a slot or a run id across lines."""
    from airflow_resumable.commands import _print

    long_job = "partitioned_export_decorated.export_orders_for_every_region[12]"
    run_id = "manual__2026-12-02T05:05:26.424130+00:00"
    rows = [{"job": long_job, "status": "running", "run_id": run_id, "note": "a few words that may wrap here"},
            {"job": "a.b", "status": "done", "run_id": "scheduled__2026-01-01T00:00:00+00:00", "note": ""}]
    import airflow.cli.simple_table as simple_table

    monkeypatch.setattr(simple_table, "is_tty", lambda: True)  # a terminal, COLUMNS wide
    for width in ("40", "80", "200"):
        monkeypatch.setenv("COLUMNS", width)
        _print(rows, "table")
        out = capsys.readouterr().out
        lines = out.splitlines()
        for whole in (long_job, run_id, "scheduled__2026-01-01T00:00:00+00:00"):
            assert any(whole in line for line in lines), (width, whole, out)
        assert any("running" in line for line in lines) and any("done" in line for line in lines), out
