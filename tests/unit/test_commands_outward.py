"""``airflow resumable show``, ``list`` and ``history`` print no credential a handler's error held and no
raw control character a row holds, and ``--by`` with an escape sequence is refused before anything is
written. On both stores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import Attempt, Options, Store
from airflow_resumable.core.model.checkpoint import Origin
from airflow_resumable.core.model.identity import Identity
from support.module_cli import resumable_cli
from support.slots import SLOT
from support.stores import empty_store

A = "dag_a.export"
#: What a careless driver's error says: a DSN with its password, and a libpq-style pair.
ERROR = "could not connect to postgresql://u:s3cret@h/db (dsn: host=h password=s3cret)"
ESCAPES = "\x1b]0;pwned\x07\x1b[2J"


@pytest.fixture
def failed(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A slot of ``dag_a`` whose handler failed at 10 of 30 with :data:`ERROR`, on each store."""
    s, uri = empty_store(store_kind, tmp_path, request)

    def handler(ctx: Any) -> None:
        ctx.total = 30
        i = ctx.position or 0
        while i < 30:
            if i == 10:
                raise RuntimeError(ERROR)
            i += 5
            ctx.checkpoint(i, processed=i)

    attempt = Attempt(s, Identity(job=A, slot=SLOT, attempt=1, owner="owner-1",
                                  origin=Origin(dag_id="dag_a", task_id="export", run_id="run_1", map_index=-1)),
                      options=Options(lease=3.0), heartbeat=0.05)
    with pytest.raises(RuntimeError):
        attempt.run(handler)
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", uri)
    with s.open(autocommit=True) as session:
        assert "s3cret" not in (session.checkpoints.load(A, SLOT).last_error or "")  # sanitized at the source
        # As a row written before the error was sanitized at its source holds it: the way out sanitizes it too.
        for table, column in (("resumable_checkpoints", "last_error"), ("resumable_attempts", "error")):
            session.execute(f"UPDATE {table} SET {column} = %(e)s WHERE {column} IS NOT NULL",
                            {"e": f"RuntimeError: {ERROR}"})
        session.commit()
        assert "s3cret" in (session.checkpoints.load(A, SLOT).last_error or "")
    return s


@pytest.mark.parametrize("output", ["json", "table", "yaml", "plain"])
def test_show_list_and_history_never_print_the_password_of_a_handler_s_error(
        failed: Store, capsys: pytest.CaptureFixture[str], output: str) -> None:
    for argv in (("show", A, SLOT), ("list",), ("history", A, SLOT)):
        code, out, err = resumable_cli(*argv, "--output", output, capsys=capsys)
        assert code == 0, err
        assert "s3cret" not in out + err, (argv, out)
        if output == "json" and argv[0] != "list":
            assert "postgresql://h/db" in out and "password=***" in out, (argv, out)  # the rest of the error stays


def test_a_by_holding_escape_sequences_is_refused_naming_the_job_and_slot_and_nothing_is_recorded(
        failed: Store, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = resumable_cli("pause", A, SLOT, "--by", ESCAPES, capsys=capsys)
    assert code == 1 and "\x1b" not in out + err and "\x07" not in out + err
    assert "holds a control character" in err and repr(A) in err and repr(SLOT) in err and "--by" in err
    assert "\\x1b]0;pwned\\x07" in err  # what was refused, written out
    with failed.open() as session:
        assert [h.outcome for h in session.listings.history(A, SLOT)] == ["failed"]
        assert session.checkpoints.load(A, SLOT).request is None


@pytest.mark.parametrize("output", ["table", "json", "plain"])
def test_a_row_edited_by_hand_to_hold_escape_sequences_is_printed_escaped_by_history_and_show(
        failed: Store, capsys: pytest.CaptureFixture[str], output: str) -> None:
    code, _, err = resumable_cli("pause", A, SLOT, "--by", "ops", capsys=capsys)
    assert code == 0, err
    with failed.open(autocommit=True) as session:
        for table in ("resumable_checkpoints", "resumable_attempts"):
            session.execute(f"UPDATE {table} SET requested_by = %(by)s WHERE requested_by = 'ops'",
                            {"by": f"ops{ESCAPES}\u202e"})
        session.execute("UPDATE resumable_checkpoints SET last_error = %(e)s", {"e": f"boom{ESCAPES}\r\x9b31m"})
        session.commit()
    for argv in (("history", A, SLOT), ("show", A, SLOT)):
        code, out, err = resumable_cli(*argv, "--output", output, capsys=capsys)
        assert code == 0, err
        raw = [c for c in out if c in "\x1b\x07\r\x9b\u202e"]
        assert not raw, (argv, raw)
        shown = json.dumps(json.loads(out)) if output == "json" else out
        assert "ops\\x1b]0;pwned\\x07\\x1b[2J\\u202e".replace("\\", "\\\\" if output == "json" else "\\") in shown, (
            argv, out)


def test_an_error_cut_at_its_limit_keeps_no_half_of_a_password_in_the_row_or_any_output(
        store_kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Given a handler's error whose URL starts before the 2000 characters the row keeps and whose ``@``
    falls after them, When the attempt fails, Then neither the row, its history nor show and history in
    any output hold the user or a piece of the password (a cut by length left ``postgresql://alice:hun...``,
    no longer a URL with userinfo, and went out as it was)."""
    s, uri = empty_store(store_kind, tmp_path, request)
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", uri)
    for pad in (1958, 1960, 1962):
        slot = f"{SLOT}-{pad}"

        def handler(ctx: Any, pad: int = pad) -> None:
            raise RuntimeError("x" * pad + " postgresql://alice:hunter2secret@db.internal/x")

        attempt = Attempt(s, Identity(job=A, slot=slot, attempt=1, owner="owner-1",
                                      origin=Origin(dag_id="dag_a", task_id="export", run_id="run_1", map_index=-1)),
                          options=Options(lease=3.0), heartbeat=0.05)
        with pytest.raises(RuntimeError):
            attempt.run(handler)
        with s.open() as session:
            stored = [session.checkpoints.load(A, slot).last_error or ""]
            stored += [r.error or "" for r in session.listings.history(A, slot)]
        assert not [e for e in stored if "alice" in e or "hunter" in e], stored
        for argv in (("show", A, slot), ("history", A, slot)):
            for output in ("json", "table"):
                code, out, err = resumable_cli(*argv, "--output", output, capsys=capsys)
                assert code == 0, err
                assert "alice" not in out and "hunter" not in out, (argv, out)


def test_a_value_holding_rich_markup_is_printed_as_it_is_in_a_table(
        failed: Store, capsys: pytest.CaptureFixture[str]) -> None:
    """Given a row whose error holds rich's markup (a style, a link, a closing tag with nothing to close),
    When show, history and list print it as a table, Then it is printed as written: not styled, not made
    a link, and the command does not fail on it (a stray ``[/]`` raised rich's MarkupError)."""
    markup = "[bold red]FAKE[/] [link=https://evil.example]click[/link] [/]"
    with failed.open(autocommit=True) as session:
        for table, column in (("resumable_checkpoints", "last_error"), ("resumable_attempts", "error")):
            session.execute(f"UPDATE {table} SET {column} = %(e)s WHERE {column} IS NOT NULL", {"e": markup})
        session.commit()
    for argv in (("show", A, SLOT), ("history", A, SLOT)):
        code, out, err = resumable_cli(*argv, "--output", "table", capsys=capsys)
        assert code == 0, err
        assert "[bold red]FAKE[/]" in " ".join(out.split()) and "[link=https://evil.example]" in out, (argv, out)
    code, out, err = resumable_cli("list", "--output", "table", capsys=capsys)
    assert code == 0, err


@pytest.mark.parametrize("by", ["admin\u200b", "ad\u00admin", "\ufeffadmin", "admin\u2060"])
def test_a_by_holding_an_invisible_character_is_refused(failed: Store, capsys: pytest.CaptureFixture[str],
                                                         by: str) -> None:
    """A zero-width space, a soft hyphen, a byte order mark, a word joiner: ``admin`` and a name that
    prints as ``admin`` in the history are not the same person; refused as a control character is."""
    code, out, err = resumable_cli("pause", A, SLOT, "--by", by, capsys=capsys)
    assert code == 1 and "holds a control character" in err, err
    with failed.open() as session:
        assert session.checkpoints.load(A, SLOT).request is None
