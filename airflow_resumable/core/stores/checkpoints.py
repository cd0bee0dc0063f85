"""A session's checkpoints: read a slot's row, and the fenced writes of an attempt's run (start,
save, finish), each naming the attempt's :class:`~airflow_resumable.core.model.fence.Fence`."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

from airflow_resumable.core.model import request_rules as rules
from airflow_resumable.core.model.checkpoint import AttemptEnd, AttemptRecord, Checkpoint, Origin, Status, Write
from airflow_resumable.core.model.fence import WHERE, Fence
from airflow_resumable.core.model.tables import ATTEMPTS
from airflow_resumable.core.stores.connection import Connection, save_rejected
from airflow_resumable.core.stores.dialect import Dialect
from airflow_resumable.core.stores.prepared import PreparedStatement, preparable
from airflow_resumable.core.stores.shared_sql import (
    HISTORY,
    HISTORY_COLUMNS,
    KEY,
    PENDING_STOP,
    SELECT,
    SKIPPED,
    TABLE,
    history_params,
    insert,
    json_or_none,
    named,
)
from airflow_resumable.core.stores.skips import unclaimed_note, unclaimed_sql


@dataclasses.dataclass(frozen=True)
class _SQL:
    load: str
    #: The checkpoint, already in the driver's placeholders: a run sends it after every chunk. It
    #: returns the stop request pending on the row and the split asked of it, so the holder learns
    #: of a pause, a cancel or an idle partition's ask with the checkpoint it writes anyway (no
    #: statement of its own).
    save: str
    start: dict[bool, str]
    start_history: str
    #: PostgreSQL (``writable_ctes``): the start, the history record and (reset) the skipped
    #: items' clearing in one statement; the record and the clearing only if the start matched.
    start_one: dict[bool, str] | None
    clear_skipped: str
    #: The reader whose positions the row holds (fenced).
    set_reader: str
    #: The holder's agreement to a split asked of it (fenced, and only while that asker's ask is
    #: pending): the ask cleared, the reader of what it kept and the total.
    answer_split: str
    #: The holder's refusal of a split asked of it (fenced): that asker's ask cleared (another's,
    #: written since it was withdrawn, stays for the next checkpoint).
    decline_split: str
    #: Whether the fence still holds (after a conditional fenced write that matched no row).
    fenced: str
    confirm: str
    end_record: str
    #: PostgreSQL: the end and the history record's end in one statement (by status and case).
    finish_one: bool


#: The history record's parameters inside a one-statement start (``h_`` keeps them apart from the row's).
_H = "h_"


def _start_one(start: str, clear: bool) -> str:
    """The start ``UPDATE ... RETURNING`` with the history INSERT (and the skipped items' DELETE)
    chained after it: each reads the started row, so neither happens when the fence matched nothing."""
    values = [f"%({_H}{c})s" for c in HISTORY_COLUMNS if c not in ("position_start", "processed_start")]
    columns = [c for c in HISTORY_COLUMNS if c not in ("position_start", "processed_start")]
    record = (f"INSERT INTO {HISTORY} ({', '.join(columns)}, position_start, processed_start, started_at) "
              f"SELECT {', '.join(values)}, started.position, started.processed, clock_timestamp() FROM started "
              "RETURNING id")
    cleared = (f", cleared AS (DELETE FROM {SKIPPED} AS d USING started WHERE d.job = started.job "
               "AND d.slot = started.slot AND d.status IN ('skipped', 'retry_requested'))") if clear else ""
    return (f"WITH started AS ({start}), record AS ({record}){cleared} "
            f"SELECT {SELECT}, (SELECT id FROM record) FROM started")


@functools.cache
def _sql(d: Dialect) -> _SQL:
    """The checkpoint's statements, built once per dialect."""
    now = d.now()
    # A run starting over began when its lease was taken, before the attempt's overlap check: a
    # starter of the job that checks between that check and this start sees it as the earlier run.
    fresh = ("position = NULL, state = '{}', processed = 0, total = NULL, attempts = 1, runs = runs + 1, "
             "resumed_from = NULL, started_at = lease_acquired_at, last_error = NULL, result = NULL, reader = NULL")
    resumed = "attempts = attempts + 1, resumed_from = %(resumed_from)s"
    starts = {reset: (
        f"UPDATE {TABLE} SET {sets}, status = 'running', attempt = %(attempt)s, stop_reason = NULL, "
        # The requests pending on the row that a start carries on (rules.AT_START; SET reads
        # the row as it was).
        f"{', '.join(rules.sql_carry(rules.AT_START))}, "
        f"finished_at = NULL, confirmed_at = NULL, updated_at = {now}, resume_at = NULL, rate = NULL, split_request = NULL, "
        "dag_id = %(dag_id)s, task_id = %(task_id)s, run_id = %(run_id)s, map_index = %(map_index)s "
        f"WHERE {WHERE} RETURNING {SELECT}"
    ) for reset, sets in ((True, fresh), (False, resumed))}
    return _SQL(
        load=f"SELECT {SELECT} FROM {TABLE} WHERE {KEY}",
        save=d.placeholders(
            f"UPDATE {TABLE} SET position = %(position)s, state = %(state)s, processed = %(processed)s, "
            f"total = %(total)s, rate = %(rate)s, updated_at = {now}, "
            f"lease_expires_at = COALESCE({d.now_plus('%(lease)s')}, lease_expires_at) "
            f"WHERE {WHERE} RETURNING {PENDING_STOP}, split_request"
        ),
        start=starts,
        start_history=insert(ATTEMPTS, {**named(*HISTORY_COLUMNS), "started_at": now}, returning="id"),
        start_one={reset: _start_one(sql, clear=reset) for reset, sql in starts.items()} if d.writable_ctes else None,
        clear_skipped=f"DELETE FROM {SKIPPED} WHERE {KEY} AND status IN ('skipped', 'retry_requested')",
        set_reader=f"UPDATE {TABLE} SET reader = %(reader)s WHERE {WHERE}",
        answer_split=f"UPDATE {TABLE} SET split_request = NULL, reader = COALESCE(%(reader)s, reader), "
        f"total = COALESCE(%(total)s, total), updated_at = {now} WHERE {WHERE} AND split_request = %(asker)s",
        decline_split=f"UPDATE {TABLE} SET split_request = CASE WHEN split_request = %(asker)s THEN NULL "
        f"ELSE split_request END, updated_at = {now} WHERE {WHERE}",
        fenced=f"SELECT 1 FROM {TABLE} WHERE {WHERE}",
        confirm=f"UPDATE {TABLE} SET confirmed_at = {now} WHERE {KEY} AND status = 'done' "
        "AND dag_id = %(dag_id)s AND task_id = %(task_id)s AND run_id = %(run_id)s AND map_index = %(map_index)s",
        end_record=f"UPDATE {HISTORY} SET ended_at = {now}, outcome = %(outcome)s, stop_reason = %(stop_reason)s, "
        "error = %(error)s, position_end = %(position)s, processed_end = %(processed)s "
        "WHERE id = %(id)s AND ended_at IS NULL",
        finish_one=d.writable_ctes,
    )


@functools.cache
def _finish_sql(d: Dialect, status: Status, resumes: bool) -> str:
    """How an attempt ends with ``status`` (``resumes``: a paused slot with a time to continue),
    built once per dialect and case."""
    now = d.now()
    done = status is Status.DONE
    # A finished run keeps no error: last_error and stop_reason describe an unfinished one.
    last_error = "NULL" if done else "COALESCE(%(last_error)s, last_error)"
    resume_at = d.now_plus("%(resume_in)s") if status is Status.PAUSED and resumes else "NULL"
    # The requests pending on the row that this end carries on (rules.AT_END).
    requests = "".join(f", {item}" for item in rules.sql_carry(rules.AT_END[status]))
    return (
        f"UPDATE {TABLE} SET status = %(status)s, last_error = {last_error}, stop_reason = %(stop_reason)s, "
        f"total = COALESCE(%(total)s, total), result = %(result)s, resume_at = {resume_at}, "
        f"finished_at = {now if done else 'NULL'}, updated_at = {now}, lease_owner = NULL, lease_expires_at = NULL, "
        "split_request = NULL"
        f"{requests} WHERE {WHERE} RETURNING {SELECT}"
    )


@functools.cache
def _finish_one_sql(d: Dialect, status: Status, resumes: bool) -> str:
    """PostgreSQL: :func:`_finish_sql` with the history record's end chained after it (only when
    the fence matched: it reads the finished row)."""
    record = (f"UPDATE {HISTORY} AS h SET ended_at = clock_timestamp(), outcome = %(h_outcome)s, "
              "stop_reason = %(stop_reason)s, error = %(last_error)s, position_end = finished.position, "
              "processed_end = finished.processed FROM finished WHERE h.id = %(h_id)s AND h.ended_at IS NULL")
    # A finished slot leaves no retry request pending (see Checkpoints.finish).
    swept = f", swept AS ({unclaimed_sql(alias='d', using='finished')})" if status is Status.DONE else ""
    return (f"WITH finished AS ({_finish_sql(d, status, resumes)}), ended AS ({record}){swept} "
            f"SELECT {SELECT} FROM finished")


def pending_stop(rows: list[Any]) -> str | None:
    """The stop request a checkpoint's UPDATE returned (``rows``: what it fetched): a cancel's
    reason, ``paused``, or None (none pending, or the write was fenced out)."""
    return str(rows[0][0]) if rows and rows[0][0] is not None else None


def pending_split(rows: list[Any]) -> str | None:
    """Who asked the holder for part of its range, as a checkpoint's UPDATE returned it (``rows``),
    or None (nobody, or the write was fenced out)."""
    return str(rows[0][1]) if rows and len(rows[0]) > 1 and rows[0][1] is not None else None


class Answer(NamedTuple):
    """What a checkpoint's write brought back from the row."""

    #: The stop request pending (see :func:`pending_stop`).
    stop: str | None
    #: Who asked for part of the holder's range (see :func:`pending_split`).
    split: str | None

    @classmethod
    def of(cls, rows: list[Any]) -> Answer:
        return cls(pending_stop(rows), pending_split(rows))


class Checkpoints:
    """The checkpoint operations of one session (``session.checkpoints``)."""

    def __init__(self, connection: Connection):
        self._c = connection
        self._save_cursor: Any = None
        #: The checkpoint's UPDATE, prepared on this connection where the server keeps it.
        self._prepared = (PreparedStatement(_sql(connection.d).save)
                          if connection.d.prepares and preparable(connection.conn) else None)

    def load(self, job: str, slot: str) -> Checkpoint | None:
        """The slot's row, or None.

        Raises:
            CorruptCheckpoint: the row cannot be read (see :meth:`Connection.row`).
        """
        c = self._c
        row = c.execute(_sql(c.d).load, {"job": job, "slot": slot}).fetchone()
        c.commit()
        return None if row is None else c.row(row)

    def start(
        self, fence: Fence, attempt: int, *, reset: bool, resumed_from: str | None, record: AttemptRecord | None = None,
    ) -> tuple[Checkpoint, int | None]:
        """Record that ``attempt`` runs now; with ``reset``, discard position, state and counters.

        The attempt's history ``record``, if given, is inserted in the same transaction. Returns
        the row and the record's id.

        Raises:
            LeaseLost: another attempt took the lease over first (:class:`CheckpointDeleted`: the row is gone).
        """
        c = self._c
        sql = _sql(c.d)
        o = record or AttemptRecord()
        params = {
            **fence.params(), "attempt": attempt, "resumed_from": resumed_from,
            "dag_id": o.dag_id, "task_id": o.task_id, "run_id": o.run_id, "map_index": o.map_index,
        }
        if sql.start_one is not None and record is not None and c.autocommit and not c.in_transaction:
            # one statement, one round trip
            history = history_params(record)
            row = c.execute(sql.start_one[reset], {**params, **{f"{_H}{k}": v for k, v in history.items()}}).fetchone()
            if row is None:
                raise c.fenced_out(fence, "the lease was taken over before the attempt started")
            return c.row(row[:-1]), int(row[-1])
        with c.transaction():
            if reset:  # the run starts over: its skipped items are found again (or not)
                c.execute(sql.clear_skipped, fence.params())
            row = c.execute(sql.start[reset], params).fetchone()
            if row is None:
                raise c.fenced_out(fence, "the lease was taken over before the attempt started")
            cp = c.row(row)
            if record is None:
                return cp, None
            record_id = c.execute(sql.start_history, history_params(
                record, position_start=cp.position, processed_start=cp.processed)).fetchone()[0]
        return cp, int(record_id)

    def set_reader(self, fence: Fence, reader: str) -> None:
        """Record the identity of the reader whose positions the row holds (JSON text), fenced,
        without a commit of its own: at once in autocommit mode, else with the next checkpoint.

        Raises:
            LeaseLost: another attempt holds the lease (:class:`CheckpointDeleted`: the row is gone).
        """
        c = self._c
        if c.execute(_sql(c.d).set_reader, {**fence.params(), "reader": reader}).rowcount != 1:
            raise c.fenced_out(fence, "the reader could not be recorded: the lease was taken over")

    def save(self, fence: Fence, write: Write, lease: float | None = None) -> Answer:
        """Write a checkpoint and commit it, together with whatever else this connection wrote, and
        renew the lease by ``lease`` seconds (the holder's own commit proves it alive; None: leave
        the lease as the keeper renewed it).

        Returns what the checkpoint's own statement read back from the row (:class:`Answer`): the
        stop request pending on it (a cancel's reason, ``requested``, ``superseded``..., ``paused``
        when a pause was asked, or None) and who asked for part of its range (or None).

        Raises:
            LeaseLost: another attempt holds the lease; nothing was committed.
            CheckpointDeleted: the row is gone (deleted by hand); nothing was committed.
        """
        c = self._c
        c.check_loan()  # a lent connection's transaction must still be the chunk's (no round trip)
        cur = self._save_cursor
        if cur is None:  # one cursor for every checkpoint of the session
            cur = self._save_cursor = c.cursor()
        sql, params = self.save_statement(fence, write, lease)
        if c.d.one_writer:
            with c.conn.own():  # SQLite's statement (and its rowcount) ends with its rows
                rows = c.conn.write(lambda: cur.execute(c.qualified(sql), params).fetchall())
        elif self._prepared is None or self._prepared.plain is not sql:
            cur.execute(c.qualified(sql), params)
            rows = cur.fetchall()
        else:  # PostgreSQL through psycopg2: by name once prepared (stores/prepared.py)
            text = self._prepared.text(autocommit=c.autocommit)
            try:
                cur.execute(c.qualified(text), params)
            except Exception as exc:
                if not self._prepared.gone(exc, text):
                    raise
                cur.execute(c.qualified(sql), params)  # the failed EXECUTE changed nothing
            else:
                self._prepared.sent(text)
            rows = cur.fetchall()
        if cur.rowcount != 1:
            c.rollback()
            raise c.fenced_out(fence, save_rejected(fence.job, fence.slot).message)
        c.commit()
        return Answer.of(rows)

    def save_statement(self, fence: Fence, write: Write, lease: float | None = None) -> tuple[str, dict[str, Any]]:
        """The checkpoint's fenced UPDATE, in this driver's placeholders, and its parameters: it
        changes one row, or none once another attempt holds the lease, and returns the row's
        pending stop request and split ask (:class:`Answer` reads them). Sent by :meth:`save`, or without
        waiting by a pipelined writer (core/attempt/pipeline.py)."""
        return _sql(self._c.d).save, {
            "position": write.position, "state": write.state, "processed": write.processed, "total": write.total,
            "rate": write.rate, "lease": lease,
            "job": fence.job, "slot": fence.slot, "owner": fence.owner, "token": fence.token,
        }

    def answer_split(self, fence: Fence, *, asker: str | None, reader: str | None = None,
                     total: int | None = None) -> bool:
        """Answer ``asker``'s split asked of the holder, fenced, without a commit of its own (inside
        the agreement's transaction, or at once in autocommit mode). With ``reader`` (JSON text) and
        ``total``: agree, recording what the holder kept of its range, only while ``asker``'s ask is
        still pending; False: it is not (withdrawn: its asker went away, so nothing was written and
        the split must not be agreed). Without: decline, clearing ``asker``'s ask if it is pending.

        Raises:
            LeaseLost: another attempt holds the lease (:class:`CheckpointDeleted`: the row is gone).
        """
        c = self._c
        sql = _sql(c.d)
        params = {**fence.params(), "asker": asker}
        if reader is None and total is None:
            if c.execute(sql.decline_split, params).rowcount != 1:
                raise c.fenced_out(fence, "the split asked of the slot was not answered: the lease was taken over")
            return True
        if c.execute(sql.answer_split, {**params, "reader": reader, "total": total}).rowcount == 1:
            return True
        if c.execute(sql.fenced, fence.params()).fetchone() is None:
            raise c.fenced_out(fence, "the split asked of the slot was not answered: the lease was taken over")
        return False

    def finish(
        self,
        fence: Fence,
        *,
        status: Status,
        last_error: str | None = None,
        stop_reason: str | None = None,
        total: int | None = None,
        result: str | None = None,
        record_id: int | None = None,
        resume_in: float | None = None,
        attempt: int | None = None,
    ) -> Checkpoint:
        """Record how the attempt ended (and the total, if it became known; the handler's result
        with ``done``), end its history record, and release the lease: one transaction.

        With ``done``, the slot's skipped items still ``retry_requested`` go back to ``skipped`` in
        the same transaction, their ``error`` saying that ``attempt`` finished the slot without
        carrying the retry out: no accepted request is left pending for good.

        ``stop_reason`` is why the attempt stopped short: a cancel's reason, or a pause's
        (``paused``, ``throttled``, ``time_slice``); the column is ``stop_reason`` for history's
        sake. The requests pending on the row are carried on as :data:`~airflow_resumable.core.model.request_rules.AT_END`
        says (``paused`` consumes a pending pause and keeps a cancel request, for the paused slot's
        waiter); ``resume_in`` is how many seconds from now a throttled or time-sliced slot
        continues (``resume_at``).

        Raises:
            LeaseLost: another attempt holds the lease; the row was not touched.
            CheckpointDeleted: the row is gone (deleted by hand).
        """
        c = self._c
        done = status is Status.DONE
        params = {
            **fence.params(), "status": status.value, "last_error": last_error, "stop_reason": stop_reason,
            "total": total, "result": result if done else None, "resume_in": resume_in,
            "unclaimed": unclaimed_note(attempt or 0),
        }
        if record_id is not None and _sql(c.d).finish_one and c.autocommit and not c.in_transaction:
            # one statement, one round trip
            row = c.execute(_finish_one_sql(c.d, status, resume_in is not None), {
                **params, "h_outcome": AttemptEnd(status.value).value, "h_id": record_id}).fetchone()
            if row is None:
                raise c.fenced_out(fence, "final status rejected: the lease was taken over")
            return c.row(row)
        with c.transaction():
            row = c.execute(_finish_sql(c.d, status, resume_in is not None), params).fetchone()
            if row is None:
                raise c.fenced_out(fence, "final status rejected: the lease was taken over")
            cp = c.row(row)
            if done:
                c.execute(unclaimed_sql(), params)
            if record_id is not None:
                self._end_record(record_id, AttemptEnd(status.value), stop_reason=stop_reason, error=last_error,
                                 position=cp.position, processed=cp.processed)
        return cp

    def confirm(self, job: str, slot: str, origin: Origin) -> bool:
        """Record that the embedding (Airflow) counted the task instance that finished the slot as
        successful. Only a ``done`` row last run by that task instance is marked."""
        c = self._c
        n = c.execute(_sql(c.d).confirm, {
            "job": job, "slot": slot, "dag_id": origin.dag_id, "task_id": origin.task_id, "run_id": origin.run_id,
            "map_index": origin.map_index,
        }).rowcount
        c.commit()
        return bool(n > 0)

    def end_record(self, record_id: int, outcome: AttemptEnd, *, error: str | None = None,
                   stop_reason: str | None = None, position: Any = None, processed: int | None = None) -> None:
        """End an attempt's history record on its own (an attempt that lost its lease writes
        nothing else)."""
        with self._c.transaction():
            self._end_record(record_id, outcome, error=error, stop_reason=stop_reason, position=position,
                             processed=processed)

    def _end_record(self, record_id: int, outcome: AttemptEnd, *, error: str | None, stop_reason: str | None,
                    position: Any, processed: int | None) -> None:
        c = self._c
        c.execute(_sql(c.d).end_record, {
            "id": record_id, "outcome": outcome.value, "stop_reason": stop_reason, "error": error,
            "position": json_or_none(position), "processed": processed,
        })


class NoWaitSaves:
    """One attempt's checkpoints sent on a connection of their own that does not wait for the
    answer (PostgreSQL's non-blocking libpq: :meth:`Store.connect_nowait`), the answer collected
    when the next one is sent (or the attempt ends): the handler's next chunk runs meanwhile. The
    statement is the session's :meth:`Checkpoints.save_statement`, prepared on that connection
    where the server keeps it, sent again as text when the server lost it. A connection that broke
    is dropped, and the next send opens another."""

    def __init__(self, store: Any, session: Any, conn: Any):
        self._store = store
        self._statement = session.checkpoints.save_statement
        self._like = session.conn
        self._conn: Any = conn
        self._connected = False
        self._prepared: PreparedStatement | None = None  # made with the first statement (its text)
        #: the statement in flight: its cursor, what was sent and its parameters
        self._pending: tuple[Any, str, dict[str, Any]] | None = None

    def send(self, fence: Fence, write: Write, lease: float | None) -> None:
        """Send ``write``'s checkpoint, fenced by ``fence``, without waiting for its answer.

        Raises:
            Exception: the driver's, when it could not be sent (the connection is dropped).
        """
        sql, params = self._statement(fence, write, lease)
        try:
            if self._conn is None:  # the last one broke: start another
                self._conn = self._store.connect_nowait(like=self._like)
            if not self._connected:
                self._store.wait(self._conn, connecting=True)
                self._connected = True
            if self._prepared is None or self._prepared.plain is not sql:
                self._prepared = PreparedStatement(sql, enabled=self._store.dialect.prepares)
            text = self._prepared.text(autocommit=True)  # this connection is never in a transaction
            cur = self._conn.cursor()
            cur.execute(text, params)
        except Exception:
            self.close()
            raise
        self._pending = (cur, text, params)

    def answer(self) -> tuple[list[Any], int]:
        """Wait for the answer of the checkpoint in flight: the rows it returned (see
        :func:`pending_stop`) and how many rows it matched (0: fenced out).

        Raises:
            Exception: the driver's, when it failed (the connection is dropped).
        """
        pending, self._pending = self._pending, None
        assert pending is not None, "answer() after send()"
        cur, text, params = pending
        try:
            try:
                self._store.wait(self._conn)
            except Exception as exc:
                if self._prepared is None or not self._prepared.gone(exc, text):
                    raise
                cur.execute(self._prepared.plain, params)  # the failed EXECUTE changed nothing
                self._store.wait(self._conn)
            else:
                if self._prepared is not None:
                    self._prepared.sent(text)
            return cur.fetchall(), cur.rowcount
        except Exception:
            self.close()  # a broken connection: the next send opens a new one
            raise

    def close(self) -> None:
        """Drop the connection (and anything in flight)."""
        self._pending = None
        self._prepared = None  # a new connection prepares again
        conn, self._conn, self._connected = self._conn, None, False
        if conn is not None:
            try:
                conn.close()
            except Exception:  # pragma: no cover - closing a broken connection
                pass
