"""``airflow resumable ...``: each command through Airflow's own CLI parser (the provider's ``cli``
entry), and one real ``airflow`` subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import SQLiteStore, Store
from support.slots import SLOT, run_slot

A, B = "dag_a.export", "dag_b.export"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    s = SQLiteStore(tmp_path / "checkpoints.db")
    run_slot(s, A, "dag_a", fail_at=10)
    run_slot(s, B, "dag_b")
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", f"sqlite:///{s.path}")
    return s


@pytest.fixture(scope="module")
def parser() -> Any:
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


def test_show_prints_the_row_its_figures_and_what_it_would_take(store: Store, parser: Any, capsys: Any) -> None:
    code, out, _ = cli(parser, capsys, "resumable", "show", A, SLOT, "--output", "json")
    view = json.loads(out)
    assert code == 0 and (view["status"], view["position"], view["lease"]) == ("failed", 10, "none")
    assert view["offers"]["pause"] and not view["offers"]["cancel"]
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
    from airflow_resumable.core.control import default_by

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
    from airflow_resumable.core.migrations import SCHEMA_VERSION

    code, out, _ = cli(parser, capsys, "resumable", "migrate", "--check")
    assert code == 0 and f"schema {SCHEMA_VERSION}, this code needs {SCHEMA_VERSION}" in out
    code, out, _ = cli(parser, capsys, "resumable", "migrate")
    assert code == 0 and "nothing to do" in out


def test_a_missing_connection_says_how_to_configure_it(store: Store, parser: Any, capsys: Any) -> None:
    code, _, err = cli(parser, capsys, "resumable", "list", "--conn-id", "no_such_conn")
    assert code == 1 and "AIRFLOW_CONN_NO_SUCH_CONN" in err


def test_the_airflow_command_line_has_the_group(store: Store, airflow_home: Path) -> None:
    airflow = Path(sys.executable).parent / "airflow"
    result = subprocess.run([str(airflow), "resumable", "list", "--output", "json"], capture_output=True, text=True,
                            env=os.environ.copy(), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [r["job"] for r in json.loads(result.stdout.strip().splitlines()[-1])] == [B, A]


def test_clean_removes_finished_slots_past_an_age(store: Store, parser: Any, capsys: Any) -> None:
    code, out, _ = cli(parser, capsys, "resumable", "clean", "--older-than", "1h", "--dry-run")
    assert code == 0 and "would remove 0 finished slot(s)" in out
