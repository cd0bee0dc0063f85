"""The checkpoint's UPDATE prepared on the server (PostgreSQL through psycopg2): planned once per
connection, sent by name, and sent as text again when the server process lost it (a pooler such
as PgBouncer in transaction mode) without losing or repeating a checkpoint."""

from __future__ import annotations

import re
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest

from airflow_resumable.core import Attempt, Cancelled, Options, control
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.stores import PostgresStore
from airflow_resumable.core.stores.checkpoints import NoWaitSaves

JOB = "prepared"


class Sent(psycopg2.extensions.cursor):
    """A psycopg2 cursor that keeps the text of every statement it sends (``Sent.log``)."""

    log: list[str] = []

    def execute(self, sql: Any, args: Any = None) -> Any:
        Sent.log.append(str(sql))
        return super().execute(sql, args)


@pytest.fixture
def recorded(pg_params: dict[str, Any]) -> tuple[PostgresStore, list[Any]]:
    """A PostgreSQL store whose connections record what they send, and the connections it opened."""
    Sent.log = []
    opened: list[Any] = []

    def connect() -> Any:
        conn = psycopg2.connect(**pg_params, cursor_factory=Sent)
        opened.append(conn)
        return conn

    store = PostgresStore.from_connect(connect, host=pg_params.get("host"), dbname=pg_params.get("dbname"))
    with store.open() as s:
        s.ensure_schema()
    return store, opened


def _saves() -> list[str]:
    """What the attempt sent for its checkpoints: ``prepare+execute``, ``execute`` or ``text``."""
    out = []
    for sql in Sent.log:
        if sql.startswith("PREPARE resumable_"):
            out.append("prepare+execute")
        elif sql.startswith("EXECUTE resumable_"):
            out.append("execute")
        elif re.match(r"UPDATE (\S+\.)?resumable_checkpoints SET position", sql):  # in its schema, once lent
            out.append("text")
    return out


def _row(store: PostgresStore, slot: str) -> Any:
    with store.open() as s:
        return s.checkpoints.load(JOB, slot)


def test_a_run_s_checkpoints_are_prepared_once_and_then_sent_by_name(
    recorded: tuple[PostgresStore, list[Any]],
) -> None:
    store, _ = recorded

    # When an attempt saves five checkpoints
    def handler(ctx: Any) -> None:
        for i in range(1, 6):
            ctx.checkpoint(i, processed=i)

    Attempt(store, Identity(job=JOB, slot="s1", attempt=1, owner="a")).run(handler)
    # Then the first prepares the statement in its own round trip, the others name it
    assert _saves() == ["prepare+execute"] + ["execute"] * 4
    row = _row(store, "s1")
    assert (row.status, row.position, row.processed) == ("done", 5, 5)


def test_a_checkpoint_whose_prepared_statement_the_server_lost_is_sent_as_text_and_nothing_is_lost(
    recorded: tuple[PostgresStore, list[Any]],
) -> None:
    store, opened = recorded

    # Given an attempt whose server process forgets its prepared statements after checkpoint 2
    # (what a pooler in transaction mode does when it hands over another server process)
    def handler(ctx: Any) -> None:
        for i in range(1, 6):
            ctx.checkpoint(i, processed=i)
            if i == 2:
                with opened[-1].cursor() as cur:
                    cur.execute("DEALLOCATE ALL")

    outcome = Attempt(store, Identity(job=JOB, slot="s1", attempt=1, owner="a")).run(handler)
    # Then checkpoint 3's EXECUTE failed, it was sent again as text, and so were the rest
    assert _saves() == ["prepare+execute", "execute", "execute", "text", "text", "text"]
    # and every checkpoint is there, once
    assert outcome.checkpoint.position == 5
    row = _row(store, "s1")
    assert (row.status, row.position, row.processed) == ("done", 5, 5)


def test_a_checkpoint_inside_the_handlers_transaction_is_sent_as_text(
    recorded: tuple[PostgresStore, list[Any]],
) -> None:
    store, _ = recorded

    # Given a handler that writes through ctx.transaction() from its third chunk on
    def handler(ctx: Any) -> None:
        for i in range(1, 5):
            if i >= 3:
                ctx.transaction().cursor().execute("SELECT 1")
            ctx.checkpoint(i, processed=i)

    Attempt(store, Identity(job=JOB, slot="s1", attempt=1, owner="a")).run(handler)
    # Then those checkpoints go as text: a failed EXECUTE there would undo the handler's writes
    assert _saves() == ["prepare+execute", "execute", "text", "text"]
    assert _row(store, "s1").position == 4


def test_a_stale_attempt_s_prepared_checkpoint_is_fenced_out_like_any_other(
    recorded: tuple[PostgresStore, list[Any]],
) -> None:
    from airflow_resumable.core.model.errors import LeaseLost

    store, _ = recorded
    # Given attempt 1 saved two checkpoints (the statement prepared), then attempt 2 took over
    taken: list[Any] = []

    def stale(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        ctx.checkpoint(2, processed=2)
        with store.open(autocommit=True) as s:
            s.execute("UPDATE resumable_checkpoints SET lease_token = lease_token + 1, lease_owner = 'b' "
                      "WHERE job = %s AND slot = %s", (JOB, "s1"))
        taken.append(True)
        ctx.checkpoint(3, processed=3)  # sent by name, matches no row

    with pytest.raises(LeaseLost):
        Attempt(store, Identity(job=JOB, slot="s1", attempt=1, owner="a"), options=Options(lease=30)).run(stale)
    # Then the stale checkpoint changed nothing
    assert taken and _saves()[:3] == ["prepare+execute", "execute", "execute"]
    row = _row(store, "s1")
    assert (row.position, row.processed, row.lease_owner) == (2, 2, "b")


def test_a_pipelined_checkpoint_whose_prepared_statement_the_server_lost_is_sent_again_as_text(
    recorded: tuple[PostgresStore, list[Any]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, _ = recorded
    # Given the pipelined writer's server process forgets its prepared statements once the first
    # checkpoint is durable (checkpoint 2's EXECUTE, sent next, then fails)
    answer = NoWaitSaves.answer
    answered: list[int] = []

    def forgetful(self: NoWaitSaves) -> tuple[list[Any], int]:
        out = answer(self)
        answered.append(1)
        if len(answered) == 1 and self._conn is not None:
            cur = self._conn.cursor()
            cur.execute("DEALLOCATE ALL")
            self._store.wait(self._conn)
        return out

    monkeypatch.setattr(NoWaitSaves, "answer", forgetful)
    written: list[str] = []
    send = NoWaitSaves.send

    def recording(self: NoWaitSaves, fence: Any, write: Any, lease: Any) -> None:
        send(self, fence, write, lease)
        assert self._pending is not None
        written.append(self._pending[1].split(" ", 1)[0])

    monkeypatch.setattr(NoWaitSaves, "send", recording)

    # When an attempt pipelines six checkpoints
    def handler(ctx: Any) -> None:
        for i in range(1, 7):
            ctx.checkpoint(i, processed=i)

    outcome = Attempt(
        store, Identity(job=JOB, slot="s1", attempt=1, owner="a"), options=Options(pipeline_checkpoints=True),
    ).run(handler)
    # Then checkpoint 2's EXECUTE (in flight when its server process forgot) failed, was sent again
    # as text when collected, the later ones went as text, and every checkpoint is durable
    assert written[:2] == ["PREPARE", "EXECUTE"] and set(written[2:]) == {"UPDATE"} and len(written) == 6
    assert outcome.checkpoint.position == 6
    row = _row(store, "s1")
    assert (row.status, row.position, row.processed) == ("done", 6, 6)


@pytest.mark.parametrize("pipelined", [False, True], ids=["sync", "pipelined"])
def test_a_prepared_checkpoint_brings_back_a_cancel_asked_since_the_last_one(
    recorded: tuple[PostgresStore, list[Any]], pipelined: bool,
) -> None:
    store, _ = recorded

    # Given a run whose checkpoints go by name (EXECUTE), and a cancel asked right after checkpoint 4
    def handler(ctx: Any) -> None:
        for i in range(1, 100):
            ctx.checkpoint(i, processed=i)
            if i == 4:
                control.cancel(store, JOB, "s1", by="erin")

    # When the run goes on
    with pytest.raises(Cancelled) as stopped:
        Attempt(
            store, Identity(job=JOB, slot="s1", attempt=1, owner="a"),
            options=Options(lease=600, pipeline_checkpoints=pipelined),
        ).run(handler)
    # Then the EXECUTE of checkpoint 5 returned it (no heartbeat in a 600 s lease's first 200 s) and
    # the run stopped there; pipelined, once that result was collected, at checkpoint 6 (or 5, when
    # checkpoint 4's EXECUTE, sent without waiting, ran on the server after the cancel)
    assert stopped.value.message == "cancel requested by erin"
    row = _row(store, "s1")
    assert row.status == "cancelled" and row.position in ((5, 6) if pipelined else (5,))
    if not pipelined:
        assert _saves() == ["prepare+execute"] + ["execute"] * 4
