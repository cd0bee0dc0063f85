"""The one row decoder (``read_record``): every row read back from the checkpoint tables (a slot's
row, a history record, a skipped item) is read whole or refused with ``CorruptCheckpoint`` naming
the column, the job, the slot and how to put it right, before any of it is used; the row is left
as it is.

A number is within its column's range (``MAX_NUMBER``: PostgreSQL's INTEGER and BIGINT, from 0, a map
index from -1), a rate finite and >= 0, a status, request, outcome or item format one this release
writes. Property tests over generated rows (each table's columns, numbers across the whole range and
its edges); hand edits on both stores.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_resumable.core import Attempt, Options
from airflow_resumable.core.model.checkpoint import Checkpoint, DeadLetter, Status
from airflow_resumable.core.model.columns import MAX_NUMBER, Table
from airflow_resumable.core.model.errors import CorruptCheckpoint
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.model.tables import ATTEMPTS, CHECKPOINTS, DEAD_LETTERS, all_tables
from airflow_resumable.core.stores import Store
from airflow_resumable.core.stores.decoder import read_record
from support.stored_rows import bad_rows, rows

JOB, SLOT = "export", "2026-01-01T12:00:00+00:00"

# -- the rule, on generated rows ------------------------------------------------------------------


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(all_tables()).flatmap(lambda t: st.tuples(st.just(t), rows(t))))
def test_every_row_in_its_columns_ranges_is_read(table_row: tuple[Table, tuple[Any, ...]]) -> None:
    table, row = table_row
    record = read_record(table, row)
    for (i, col) in table.judged:
        assert record.__dict__[col.name] == row[i] or (row[i] != row[i])  # read as it was stored
    if table is CHECKPOINTS:
        assert isinstance(record.state, dict)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(all_tables()).flatmap(lambda t: st.tuples(st.just(t), bad_rows(t))))
def test_every_row_with_a_number_or_status_out_of_its_range_is_refused_naming_the_column(
        table_row: tuple[Table, tuple[tuple[Any, ...], str]]) -> None:
    table, (row, name) = table_row
    job, slot = row[table.names.index("job")], row[table.names.index("slot")]
    with pytest.raises(CorruptCheckpoint) as err:
        read_record(table, row)
    assert (err.value.job, err.value.slot) == (job, slot)
    assert err.value.message.startswith(f"the stored {name} "), err.value.message
    assert "is out of the column's range" in err.value.message or "is not" in err.value.message
    if table is CHECKPOINTS:
        assert "The row was left as it is" in str(err.value) and "DELETE FROM resumable_checkpoints" in str(err.value)
    else:
        assert "The record was left as it is" in str(err.value) and f"DELETE FROM {table.name} WHERE id = " in str(err.value)


def test_the_judged_columns_are_every_number_and_every_closed_text() -> None:
    judged = {(t.name, c.name) for t in all_tables() for _, c in t.judged}
    assert {("resumable_checkpoints", n) for n in ("processed", "total", "attempt", "attempts", "runs",
                                                 "lease_token", "map_index", "rate", "status", "request")} <= judged
    assert {("resumable_attempts", n) for n in ("attempt", "pid", "map_index", "lease_token", "processed_start",
                                              "processed_end", "outcome")} <= judged
    assert {("resumable_dead_letters", n) for n in ("attempt", "status", "item_format")} <= judged
    assert MAX_NUMBER == {"int": 2**31 - 1, "bigint": 2**63 - 1, "id": 2**63 - 1}


def test_the_most_a_checkpoint_s_count_may_be_is_the_most_the_decoder_reads() -> None:
    """A row the product writes is never refused: ``ctx.checkpoint()`` takes counts up to the most a
    BIGINT holds, the decoder's bound for processed and total."""
    from airflow_resumable.core.attempt import context

    assert context._MAX_COUNT == MAX_NUMBER["bigint"]
    assert {CHECKPOINTS.columns[CHECKPOINTS.names.index(n)].kind for n in ("processed", "total")} == {"bigint"}


# -- hand edits, on both stores -------------------------------------------------------------------


def _fails_after_a_checkpoint(ctx: Any) -> None:
    ctx.total = 30
    ctx.checkpoint(10, processed=10)
    raise RuntimeError("stop")


@pytest.fixture
def slot(store: Store) -> Store:
    """A failed slot at 10 of 30 with a history record and a skipped item."""
    with pytest.raises(RuntimeError):
        Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a"), options=Options()).run(
            _fails_after_a_checkpoint)
    with store.open(autocommit=True) as s:
        s.skips.record(DeadLetter(job=JOB, slot=SLOT, position=1, item={"i": 1}, error="E", attempt=1))
        s.commit()
    return store


_EDITS = [  # table, column, value (SQL), how it is read, the fix the error names
    ("resumable_checkpoints", "total", "-10", "UPDATE resumable_checkpoints SET total = NULL WHERE job = 'export'"),
    ("resumable_checkpoints", "processed", "-1", "UPDATE resumable_checkpoints SET processed = 0 WHERE job = 'export'"),
    ("resumable_checkpoints", "attempt", "-3", "Set attempt to a value in its range"),
    ("resumable_checkpoints", "lease_token", "-1", "Set lease_token to a value in its range"),
    ("resumable_checkpoints", "map_index", "-2", "Set map_index to a value in its range"),
    ("resumable_checkpoints", "rate", "-0.5", "UPDATE resumable_checkpoints SET rate = NULL WHERE job = 'export'"),
    ("resumable_checkpoints", "status", "'stalled'", "UPDATE resumable_checkpoints SET status = 'failed' WHERE"),
    ("resumable_checkpoints", "request", "'bogus'", "UPDATE resumable_checkpoints SET request = NULL WHERE"),
    ("resumable_attempts", "processed_end", "-5", "DELETE FROM resumable_attempts WHERE id = "),
    ("resumable_attempts", "outcome", "'bogus'", "DELETE FROM resumable_attempts WHERE id = "),
    ("resumable_dead_letters", "attempt", "-1", "DELETE FROM resumable_dead_letters WHERE id = "),
    ("resumable_dead_letters", "status", "'bogus'", "DELETE FROM resumable_dead_letters WHERE id = "),
]


def _reads(s: Any, table: str) -> Any:
    return {"resumable_checkpoints": lambda: s.checkpoints.load(JOB, SLOT),
            "resumable_attempts": lambda: s.listings.history(JOB, SLOT),
            "resumable_dead_letters": lambda: s.skips.items(JOB, SLOT)}[table]


@pytest.mark.parametrize(("table", "column", "value", "fix"), _EDITS, ids=[f"{t[10:]}.{c}={v}" for t, c, v, _ in _EDITS])
def test_a_value_edited_by_hand_out_of_its_column_s_range_is_refused_naming_it_and_left_as_it_is(
        slot: Store, table: str, column: str, value: str, fix: str) -> None:
    """Before: the row was read (a total of -10 shown as -100 %, the summary adding negative rows)."""
    with slot.open(autocommit=True) as s:
        s.execute(f"UPDATE {table} SET {column} = {value} WHERE job = %(job)s", {"job": JOB})
        s.commit()
        stored = s.execute(f"SELECT {column} FROM {table} WHERE job = %(job)s", {"job": JOB}).fetchone()[0]
        with pytest.raises(CorruptCheckpoint) as err:
            _reads(s, table)()
        assert (err.value.job, err.value.slot) == (JOB, SLOT)
        assert err.value.message.startswith(f"the stored {column} {stored!r} "), err.value.message
        assert fix in str(err.value), str(err.value)
        assert s.execute(f"SELECT {column} FROM {table} WHERE job = %(job)s", {"job": JOB}).fetchone()[0] == stored


def test_the_repair_an_error_names_makes_the_row_readable_again(slot: Store) -> None:
    import re

    with slot.open(autocommit=True) as s:
        s.execute("UPDATE resumable_checkpoints SET total = -10 WHERE job = %(job)s", {"job": JOB})
        s.commit()
        with pytest.raises(CorruptCheckpoint) as err:
            s.checkpoints.load(JOB, SLOT)
        statement = re.search(r"UPDATE resumable_checkpoints SET total = NULL WHERE job = '[^']*' AND slot = '[^']*'",
                              err.value.hint)
        assert statement is not None, err.value.hint
        s.execute(statement.group(0))
        s.commit()
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.processed, row.total, row.position) == (10, None, 10)


def test_an_attempt_refuses_a_slot_with_a_negative_count_and_leaves_it_free(slot: Store) -> None:
    """Before: the retry resumed from it and counted on from -1."""
    with slot.open(autocommit=True) as s:
        s.execute("UPDATE resumable_checkpoints SET processed = -1 WHERE job = %(job)s", {"job": JOB})
        s.commit()
    ran: list[int] = []
    with pytest.raises(CorruptCheckpoint, match="the stored processed -1 is out of the column's range"):
        Attempt(slot, Identity(job=JOB, slot=SLOT, attempt=2, owner="b"), options=Options()).run(
            lambda ctx: ran.append(ctx.processed))
    assert ran == []
    with slot.open(autocommit=True) as s:
        assert s.execute("SELECT processed, lease_owner FROM resumable_checkpoints").fetchall() == [(-1, None)]


@pytest.mark.one_store("only SQLite keeps a number its INTEGER column's declared type cannot (PostgreSQL refuses "
                       "the edit itself)", kind="sqlite")
def test_a_number_past_what_postgresql_s_column_holds_is_refused_on_sqlite_too(slot: Store) -> None:
    for column, value in (("attempt", 2**31), ("map_index", 2**40), ("runs", 2**31)):
        with slot.open(autocommit=True) as s:
            before = s.execute(f"SELECT {column} FROM resumable_checkpoints").fetchone()[0]
            s.execute(f"UPDATE resumable_checkpoints SET {column} = {value}")
            s.commit()
            with pytest.raises(CorruptCheckpoint, match=f"the stored {column} {value} is out of the column's range "
                               r"\(-?[01] to 2,147,483,647\)"):
                s.checkpoints.load(JOB, SLOT)
            s.execute(f"UPDATE resumable_checkpoints SET {column} = %(v)s", {"v": before})
            s.commit()


@pytest.mark.parametrize("value", ["'Infinity'", "'NaN'", "1e999"])
def test_a_rate_that_is_not_a_finite_number_is_refused(slot: Store, store_kind: str, value: str) -> None:
    if store_kind == "postgres" and value == "1e999":
        value = "'Infinity'::float8"
    with slot.open(autocommit=True) as s:
        # (SQLite keeps the text 'NaN' as text in its REAL column, a float NaN as NULL: there it is the
        # case of a number column holding something else, refused the same way)
        s.execute(f"UPDATE resumable_checkpoints SET rate = {value}")
        s.commit()
        with pytest.raises(CorruptCheckpoint, match="the stored rate .* is not"):
            s.checkpoints.load(JOB, SLOT)


def test_a_processed_over_the_total_is_read_as_the_product_writes_it(store: Store) -> None:
    """A total is the handler's count of what it expected (``ctx.total``, a chunk loop's ``total=``,
    counted once when a run starts): rows written into the source while it runs are read too, and
    the row ends with more processed than its total. Not refused."""
    from airflow_resumable.core import chunk_loop

    items = list(range(1, 8))
    handler = chunk_loop(lambda ctx, after, limit: [i for i in items if i > (after or 0)][:limit],
                         lambda ctx, batch: None, chunk_size=3, total=5)
    done = Attempt(store, Identity(job=JOB, slot=SLOT, attempt=1, owner="a")).run(handler).checkpoint
    assert (done.status, done.processed, done.total) == (Status.DONE.value, 7, 5)
    with store.open() as s:
        row = s.checkpoints.load(JOB, SLOT)
    assert (row.processed, row.total) == (7, 5)


def test_a_slot_row_reads_the_same_through_the_store_and_the_decoder(slot: Store) -> None:
    """``Connection.row`` is the decoder: the slot's row, as the stores read it, equals it decoded directly."""
    with slot.open() as s:
        raw = s.execute(f"SELECT {CHECKPOINTS.select} FROM resumable_checkpoints").fetchone()
        loaded = s.checkpoints.load(JOB, SLOT)
        direct = read_record(CHECKPOINTS, tuple(raw), aware=s.d.aware_timestamps)
    assert isinstance(direct, Checkpoint) and direct == loaded
    assert ATTEMPTS.judged and DEAD_LETTERS.judged


def test_another_live_slot_s_row_edited_by_hand_refuses_the_overlap_check_naming_both_slots(slot: Store) -> None:
    """Before: the error named the other slot as the attempt's own ([slot=...]) and did not say why this
    attempt read it, nor what to do next."""
    with slot.open(autocommit=True) as s:  # the other slot's run is under way (paused) and its row edited by hand
        s.execute("UPDATE resumable_checkpoints SET status = 'paused', total = -10 WHERE job = %(job)s", {"job": JOB})
        s.commit()
    later = "2026-02-01T00:00:00+00:00"
    ran: list[int] = []
    with pytest.raises(CorruptCheckpoint) as err:
        Attempt(slot, Identity(job=JOB, slot=later, attempt=1, owner="b"), options=Options(overlap="skip")).run(
            lambda ctx: ran.append(ctx.processed))
    # Then the error is this attempt's, names the row that cannot be read and how to put it right
    assert ran == []
    assert (err.value.job, err.value.slot) == (JOB, later)
    assert f"the row of slot {SLOT!r} cannot be read: the stored total -10" in err.value.message
    assert "overlap policy" in err.value.message
    # And the asking slot's lease was given back at once (before: held until it ran out, the row running)
    with slot.open(autocommit=True) as s:
        held = s.execute("SELECT lease_owner FROM resumable_checkpoints WHERE job = %(job)s AND slot = %(slot)s",
                         {"job": JOB, "slot": later}).fetchone()
    assert held is None or held[0] is None, held
    assert f"UPDATE resumable_checkpoints SET total = NULL WHERE job = '{JOB}' AND slot = '{SLOT}'" in (
        err.value.hint or "")
    assert (err.value.hint or "").endswith("Then Clear this task")
    with slot.open(autocommit=True) as s:  # the edited row is left as it is
        assert s.execute("SELECT total FROM resumable_checkpoints WHERE slot = %(slot)s", {"slot": SLOT}).fetchone() == (
            -10,)
