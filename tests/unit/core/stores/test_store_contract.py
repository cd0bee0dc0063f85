"""One contract for every checkpoint store: run against SQLite and PostgreSQL alike."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from airflow_resumable.core.model.checkpoint import AttemptRecord, Status, Write
from airflow_resumable.core.model.errors import ConfigurationError, CorruptCheckpoint, LeaseLost, SchemaVersionError
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.model.tables import CHECKPOINTS
from airflow_resumable.core.stores import SCHEMA_VERSION, Store
from airflow_resumable.core.stores.leases import Start

JOB, SLOT = "export", "2026-01-01T12:00:00+00:00"


def acquire(session, owner: str = "a", lease: float = 30.0, slot: str = SLOT):
    got = session.leases.acquire(JOB, slot, owner, lease)
    assert got is not None, "the lease should have been free"
    return got.row, got.created


def test_schema_is_created_once_and_stamped(store: Store) -> None:
    with store.open() as s:
        assert s.ensure_schema() == SCHEMA_VERSION
        assert s.ensure_schema() == SCHEMA_VERSION  # idempotent
        cur = s.conn.cursor()
        cur.execute("SELECT value FROM resumable_meta WHERE key = 'schema_version'")
        assert cur.fetchone()[0] == str(SCHEMA_VERSION)


def test_a_newer_schema_is_refused_and_left_alone(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        s._execute("UPDATE resumable_meta SET value = %s WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
        s.commit()
    with store.open() as s, pytest.raises(SchemaVersionError, match="newer than this airflow-resumable understands"):
        s.ensure_schema()
    with store.open() as s:
        cur = s.conn.cursor()
        cur.execute("SELECT value FROM resumable_meta WHERE key = 'schema_version'")
        assert cur.fetchone()[0] == str(SCHEMA_VERSION + 1)


def test_first_acquire_creates_the_row_and_a_save_round_trips_json(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        row, created = acquire(s)
        assert created and row.lease_owner == "a" and row.lease_token == 1 and row.status == "running"
        position = [42, "2026-01-01", {"k": [1, 2.5, None, True]}]
        s.checkpoints.save(
            Fence(JOB, SLOT, "a", 1),
            Write(position=json.dumps(position), state=json.dumps({"total": 7}), processed=10, total=30),
        )
        got = s.checkpoints.load(JOB, SLOT)
        assert got.position == position and got.state == {"total": 7}
        assert (got.processed, got.total) == (10, 30)
        assert got.updated_at is not None and got.updated_at.tzinfo is not None


@pytest.mark.parametrize("check", [False, True])
def test_a_new_slot_starts_with_its_lease_where_the_store_can_and_only_while_nothing_else_of_the_job_is_live(
    store: Store, check: bool
) -> None:
    record = AttemptRecord(job=JOB, slot=SLOT, attempt=3, owner="a", dag_id="d", task_id="t", run_id="r",
                           map_index=-1, outcome="running")
    start = Start(attempt=3, record=record, check=check)
    with store.open() as s:
        s.ensure_schema()
        # a slot with no row: PostgreSQL creates it started, with the history record, in one statement
        got = s.leases.acquire(JOB, SLOT, "a", 30, start=start)
        assert got is not None and got.created and got.row.lease_token == 1
        if store.dialect.writable_ctes:
            assert got.record_id is not None
            assert (got.row.runs, got.row.attempts, got.row.attempt, got.row.dag_id, got.row.map_index) == (
                1, 1, 3, "d", -1)
            [history] = s.listings.history(JOB, SLOT)
            assert (history.id, history.attempt, history.lease_token, history.outcome, history.run_id) == (
                got.record_id, 3, 1, "running", "r")
        else:  # SQLite: the lease only; the attempt starts as on a row that was there
            assert got.record_id is None and got.row.runs == 0 and s.listings.history(JOB, SLOT) == []
        # another slot of the same job, while that one is live: started only when the policy does not look
        other = s.leases.acquire(JOB, "other", "b", 30, start=dataclasses.replace(start, record=dataclasses.replace(
            record, slot="other", owner="b")))
        assert other is not None and other.created and other.row.lease_owner == "b"
        started = store.dialect.writable_ctes and not check
        assert (other.record_id is not None, other.row.runs) == (started, int(started))
        # a slot that has a row: its lease is taken, nothing started
        assert s.leases.acquire(JOB, SLOT, "c", 30, start=start) is None  # live
        s.execute(f"UPDATE resumable_checkpoints SET lease_expires_at = {s.d.now()} WHERE slot = %s", (SLOT,))
        s.commit()
        again = s.leases.acquire(JOB, SLOT, "c", 30, start=start)
        assert again is not None and not again.created and again.record_id is None and again.row.lease_token == 2


def test_a_live_lease_is_not_taken_and_an_expired_one_is(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        acquire(s, owner="a", lease=30)
        assert s.leases.acquire(JOB, SLOT, "b", 30) is None
        # the holder's lease lapses (as after a crash): shorten it in the database's own clock
        s.execute(f"UPDATE resumable_checkpoints SET lease_expires_at = {s.d.now()} WHERE job = %s", (JOB,))
        s.commit()
        row, created = acquire(s, owner="b")
        assert not created and row.lease_owner == "b" and row.lease_token == 2


def test_fencing_rejects_the_stale_holder_and_keeps_the_new_one(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        acquire(s, owner="a")
        s.checkpoints.save(Fence(JOB, SLOT, "a", 1), Write(position="5", state="{}", processed=5, total=None))
        s.execute(f"UPDATE resumable_checkpoints SET lease_expires_at = {s.d.now()} WHERE job = %s", (JOB,))
        s.commit()
        acquire(s, owner="b")
        s.checkpoints.save(Fence(JOB, SLOT, "b", 2), Write(position="8", state="{}", processed=8, total=None))
        with pytest.raises(LeaseLost):
            s.checkpoints.save(Fence(JOB, SLOT, "a", 1), Write(position="6", state="{}", processed=6, total=None))
        with pytest.raises(LeaseLost):
            s.leases.heartbeat(Fence(JOB, SLOT, "a", 1), 30)
        with pytest.raises(LeaseLost):
            s.checkpoints.finish(Fence(JOB, SLOT, "a", 1), status=Status.FAILED, last_error="stale")
        row = s.checkpoints.load(JOB, SLOT)
        assert row.position == 8 and row.lease_owner == "b" and row.last_error is None


def test_a_rejected_save_rolls_back_the_chunk_writes_made_beside_it(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        s._execute("CREATE TABLE sink (item INTEGER PRIMARY KEY)")
        s.commit()
        acquire(s, owner="a")
        s._execute("UPDATE resumable_checkpoints SET lease_owner = 'b', lease_token = 9 WHERE job = %s", (JOB,))
        s.commit()
        s._execute("INSERT INTO sink (item) VALUES (1)")
        with pytest.raises(LeaseLost):
            s.checkpoints.save(Fence(JOB, SLOT, "a", 1), Write(position="1", state="{}", processed=1, total=None))
        cur = s.conn.cursor()
        cur.execute("SELECT count(*) FROM sink")
        assert cur.fetchone()[0] == 0


def test_heartbeat_extends_the_lease_and_carries_cancel_requests(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        row, _ = acquire(s, lease=5)
        assert s.leases.heartbeat(Fence(JOB, SLOT, "a", 1), 60) is None
        extended = s.checkpoints.load(JOB, SLOT)
        assert (extended.lease_expires_at - row.lease_expires_at).total_seconds() > 50
        assert s.requests.cancel(JOB, SLOT, "superseded")
        assert s.leases.heartbeat(Fence(JOB, SLOT, "a", 1), 60) == "superseded"


def test_finish_records_the_outcome_and_releases_the_lease(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        acquire(s)
        row = s.checkpoints.finish(Fence(JOB, SLOT, "a", 1), status=Status.CANCELLED, last_error="cancelled: timeout", stop_reason="timeout")
        assert (row.status, row.stop_reason, row.last_error) == ("cancelled", "timeout", "cancelled: timeout")
        assert row.lease_owner is None and row.lease_expires_at is None and row.finished_at is None
        acquire(s, owner="b")  # free for the next attempt at once
        done = s.checkpoints.finish(Fence(JOB, SLOT, "b", 2), status=Status.DONE)
        assert done.status == "done" and done.finished_at is not None
        assert done.last_error is None and done.stop_reason is None, "a finished run carries no stale error"


def test_start_resumes_or_resets(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        acquire(s)
        s.checkpoints.start(Fence(JOB, SLOT, "a", 1), 1, reset=True, resumed_from=None)
        s.checkpoints.save(Fence(JOB, SLOT, "a", 1), Write(position="3", state='{"t": 1}', processed=3, total=9))
        s.checkpoints.finish(Fence(JOB, SLOT, "a", 1), status=Status.FAILED, last_error="boom")
        acquire(s, owner="b")
        resumed, _ = s.checkpoints.start(Fence(JOB, SLOT, "b", 2), 2, reset=False, resumed_from="3")
        assert (resumed.position, resumed.processed, resumed.attempt, resumed.attempts) == (3, 3, 2, 2)
        assert resumed.resumed_from == 3 and resumed.last_error == "boom"
        reset, _ = s.checkpoints.start(Fence(JOB, SLOT, "b", 2), 2, reset=True, resumed_from=None)
        assert (reset.position, reset.state, reset.processed, reset.total, reset.attempts) == (None, {}, 0, None, 1)
        assert reset.runs == 2 and reset.last_error is None


def test_live_others_lists_only_other_live_slots_of_the_job(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        acquire(s, owner="a", slot="s1")
        acquire(s, owner="b", slot="s2")
        acquire(s, owner="c", slot="s3")
        s.checkpoints.finish(Fence(JOB, "s3", "c", 1), status=Status.DONE)
        assert s.leases.acquire("other-job", "s1", "x", 30) is not None
        assert [o.slot for o in s.listings.live_others(JOB, "s2")] == ["s1"]


def test_list_slots_is_newest_run_first_whichever_checkpointed_last(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        for i in range(3):
            acquire(s, owner=f"o{i}", slot=f"s{i}")
            s.checkpoints.save(
                Fence(JOB, f"s{i}", f"o{i}", 1), Write(position=str(i), state="{}", processed=i, total=None),
            )
        # the oldest run checkpoints last: the listing's order (by the run's start) does not change,
        # which is what lets checkpoints be in-place updates (no index covers updated_at)
        s.checkpoints.save(Fence(JOB, "s0", "o0", 1), Write(position="9", state="{}", processed=9, total=None))
        assert [r.slot for r in s.listings.list_slots(JOB, limit=2)] == ["s2", "s1"]


def test_an_unreadable_row_is_reported_with_job_and_slot_and_left_alone(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        acquire(s)
        s._execute("UPDATE resumable_checkpoints SET position = %s WHERE job = %s", ("{not json", JOB))
        s.commit()
        with pytest.raises(CorruptCheckpoint) as err:
            s.checkpoints.load(JOB, SLOT)
        assert JOB in str(err.value) and SLOT in str(err.value) and "DELETE FROM resumable_checkpoints" in str(err.value)
        s.execute(f"UPDATE resumable_checkpoints SET lease_expires_at = {s.d.now()} WHERE job = %s", (JOB,))
        s.commit()
        with pytest.raises(CorruptCheckpoint):
            s.leases.acquire(JOB, SLOT, "next", 30)  # an attempt finds it unreadable...
        cur = s.conn.cursor()
        cur.execute("SELECT lease_owner, position FROM resumable_checkpoints WHERE job = 'export'")
        assert cur.fetchone() == (None, "{not json"), "...keeps no lease on it and leaves it as it was"
        cur = s.conn.cursor()
        cur.execute("SELECT position FROM resumable_checkpoints WHERE job = 'export'")
        assert cur.fetchone()[0] == "{not json"


def test_a_history_record_or_skipped_item_edited_into_text_that_is_not_json_is_reported_naming_it(store: Store) -> None:
    """Before: json's own JSONDecodeError, naming nothing (the REST API's answer was a bare 500)."""
    from airflow_resumable.core.model.checkpoint import DeadLetter
    from airflow_resumable.core.model.request_rules import Action
    from airflow_resumable.core.model.states import AttemptEnd

    with store.open(autocommit=True) as s:
        s.ensure_schema()
        acquire(s)
        assert s.requests.apply(JOB, SLOT, Action.PAUSE, by="op", outcome=AttemptEnd.PAUSE_REQUESTED) is not None
        s.skips.record(DeadLetter(job=JOB, slot=SLOT, position=1, item={"i": 1}, error="E", attempt=1))
        s.commit()
        for table, column, read in (("resumable_attempts", "position_start", lambda: s.listings.history(JOB, SLOT)),
                                    ("resumable_dead_letters", "item", lambda: s.skips.items(JOB, SLOT))):
            s.execute(f"UPDATE {table} SET {column} = '{{bad' WHERE job = %(job)s", {"job": JOB})
            s.commit()
            with pytest.raises(CorruptCheckpoint) as err:
                read()
            assert (err.value.job, err.value.slot) == (JOB, SLOT)
            assert err.value.message.startswith(f"the stored {column} '{{bad' of a record in {table} is not valid JSON")
            assert "The record was left as it is" in str(err.value)


def test_rows_read_back_equal_the_dataclass_built_the_usual_way(store: Store) -> None:
    import dataclasses

    from airflow_resumable.core.model.checkpoint import Checkpoint

    with store.open() as s:
        s.ensure_schema()
        acquire(s)
        row = s.checkpoints.load(JOB, SLOT)
    assert [f.name for f in dataclasses.fields(Checkpoint)] == list(CHECKPOINTS.names)
    assert row == Checkpoint(**{f.name: getattr(row, f.name) for f in dataclasses.fields(Checkpoint)})
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.status = "done"  # type: ignore[misc]


@pytest.mark.parametrize(
    "job",
    ["o'brien's export", "it''s", "back\\slash'", "two\nlines", "tab\tand 'quote'", "zero\u200bwidth 'space'"],
)
def test_the_delete_statement_of_a_corrupt_row_is_valid_sql_whatever_the_names_contain(store: Store, job: str) -> None:
    import re

    # Given an unreadable row of a job whose name has quotes, a backslash or a line break
    with store.open() as s:
        s.ensure_schema()
        assert s.leases.acquire(job, SLOT, "a", 30) is not None
        s._execute("UPDATE resumable_checkpoints SET position = %s WHERE job = %s", ("{not json", job))
        s.commit()
        with pytest.raises(CorruptCheckpoint) as err:
            s.checkpoints.load(job, SLOT)
        # When a person runs the statement the error prints
        statement = re.search(r"DELETE FROM .*", err.value.hint, re.S).group(0)
        assert "\n" not in statement and "\t" not in statement, "one line, whatever the names contain"
        if " = ?" in statement:  # names a literal cannot carry safely are given as parameters
            assert repr(job) in statement
            sql, params = statement.split(" (%s on PostgreSQL)")[0], (job, SLOT)
            s._execute(sql.replace("?", "%s"), params)
        else:
            s.conn.cursor().execute(statement)
        s.commit()
        # Then exactly that row is gone
        assert s.checkpoints.load(job, SLOT) is None


@pytest.mark.parametrize("job", ["pt_tolerant.export", "50%_off", "o'brien_export", "back\\slash_job"])
def test_the_statement_deleting_a_job_s_partitions_deletes_no_other_job_s_rows(store: Store, job: str) -> None:
    # A LIKE 'pt_tolerant.export[%' read the "_" as any character: it deleted ptXtolerant.export's partitions too
    from airflow_resumable.core.stores.decoder import partitions_delete_statement

    lookalike = job.replace("_", "X").replace("%", "Y")
    keep = [(f"{lookalike}[0]", SLOT), (f"{job}#plan", SLOT), (job, SLOT), (f"{job}[0]", "2026-01-02T00:00:00+00:00")]
    gone = [(f"{job}[0]", SLOT), (f"{job}[12]", SLOT)]
    with store.open() as s:
        s.ensure_schema()
        for name, slot in keep + gone:
            assert s.leases.acquire(name, slot, "a", 30) is not None
        s.commit()
        statement = partitions_delete_statement(job, SLOT)
        if " = ?" in statement:  # names a literal cannot carry safely are given as parameters
            s._execute(statement.split(" (%s on PostgreSQL)")[0].replace("?", "%s"), (f"{job}[", SLOT))
        else:
            s.conn.cursor().execute(statement)
        s.commit()
        assert [(n, sl) for n, sl in keep + gone if s.checkpoints.load(n, sl) is not None] == keep


def test_sql_literals_double_their_quotes() -> None:
    from airflow_resumable.core.stores.decoder import delete_statement, sql_literal

    assert sql_literal("o'brien") == "'o''brien'"
    assert delete_statement("a'b", "s") == "DELETE FROM resumable_checkpoints WHERE job = 'a''b' AND slot = 's'"


def test_a_sqlite_store_on_a_relative_path_is_refused(tmp_path) -> None:
    from airflow_resumable.core.model.errors import ConfigurationError
    from airflow_resumable.core.stores import SQLiteStore

    with pytest.raises(ConfigurationError, match=r"'var/lib/x.db' is a relative path.*e.g. '/var/lib/x.db'"):
        SQLiteStore("var/lib/x.db")
    assert SQLiteStore(tmp_path / "x.db").path == str(tmp_path / "x.db")


def test_listings_find_a_task_instances_slot_and_what_each_slot_would_take(store: Store) -> None:
    """What the UI, REST API and CLI read: slots across jobs by DAG and status, a task instance's
    slot, and the requests a slot would take now (judged by the requests' own SQL conditions)."""
    from support.slots import run_slot

    run_slot(store, "a.export", "dag_a", fail_at=10)  # failed, nobody holds it
    run_slot(store, "b.export", "dag_b")  # done
    with store.open() as s:
        s.ensure_schema()
        assert s.listings.dag_ids() == {"dag_a", "dag_b"}
        assert [r.job for r in s.listings.recent()] == ["b.export", "a.export"]
        assert [r.job for r in s.listings.recent(dag_ids={"dag_a"})] == ["a.export"]
        assert [r.job for r in s.listings.recent(status="done")] == ["b.export"] and s.listings.recent(dag_ids=set()) == []
        assert s.listings.find("dag_a", "export", "run_1", -1).job == "a.export"
        assert s.listings.find("dag_a", "export", "run_2", -1) is None
        assert s.requests.offers("a.export", "2026-02-01T00:00:00+00:00") == {
            "pause": True, "resume": False, "cancel": False, "restart": True, "release": False}
        assert s.requests.offers("b.export", "2026-02-01T00:00:00+00:00") == {
            "pause": False, "resume": False, "cancel": False, "restart": True, "release": False}
        assert s.requests.offers("nope", "x") is None
        # A live holder: it takes pause and cancel, not restart or release
        acquire(s, owner="live", slot="live-slot")
        assert s.requests.offers(JOB, "live-slot") == {
            "pause": True, "resume": False, "cancel": True, "restart": False, "release": False}


def test_a_fence_is_made_from_the_acquired_row_and_only_from_a_leased_one(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        row, _ = acquire(s)
        fence = Fence.of(row)
        assert fence == Fence(JOB, SLOT, "a", 1)
        with pytest.raises(dataclasses.FrozenInstanceError):
            fence.token = 2  # type: ignore[misc]
        released = s.checkpoints.finish(fence, status=Status.DONE)
        with pytest.raises(ValueError, match=re.escape(f"job '{JOB}' slot '{SLOT}' holds no lease")):
            Fence.of(released)


def test_the_checkpoint_statement_is_built_once_per_dialect_not_per_call(store: Store) -> None:
    fence = Fence(JOB, SLOT, "a", 1)
    with store.open() as one, store.open() as two:
        first, params = one.checkpoints.save_statement(fence, Write(position="1", state="{}", processed=1, total=None))
        again, _ = two.checkpoints.save_statement(fence, Write(position="2", state="{}", processed=2, total=None))
        assert again is first, "the hot path's SQL text is one object for the dialect"
        assert "%(" not in first if store.dialect.marker == "?" else ":job" not in first
        assert params == {"position": "1", "state": "{}", "processed": 1, "total": None, "rate": None, "lease": None,
                          **fence.params()}


# -- session.plans ----------------------------------------------------------------------------------


def _partition_rows(store: Store, job: str, indexes: list[int]) -> None:
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        for i in indexes:
            assert s.leases.acquire(f"{job}[{i}]", SLOT, "a", 30.0) is not None  # the partition's row


def test_partitions_with_rows_looks_past_one_batch_of_500_and_stops_at_the_limit(store: Store) -> None:
    _partition_rows(store, "pj", [0, 499, 500, 501, 1200])
    with store.open(autocommit=True) as s:
        assert s.plans.partitions_with_rows("pj", SLOT, 1201) == ["pj[0]", "pj[499]", "pj[500]", "pj[501]", "pj[1200]"]
        assert s.plans.partitions_with_rows("pj", SLOT, 501) == ["pj[0]", "pj[499]", "pj[500]"]
        assert s.plans.partitions_with_rows("pj", SLOT, 1201, limit=3) == ["pj[0]", "pj[499]", "pj[500]"]
        assert s.plans.partitions_with_rows("pj", SLOT, 0) == []
        assert s.plans.partitions_with_rows("pj", SLOT, 1201, limit=0) == []


@pytest.mark.parametrize("limit", [-1, True, 2.5, None])
def test_partitions_with_rows_refuses_a_limit_that_is_not_a_count(store: Store, limit: object) -> None:
    # -1 used to give the first batch's rows but its last ([:-1]), True one row, as if they were counts
    _partition_rows(store, "pj", [0, 1, 2])
    with store.open(autocommit=True) as s, pytest.raises(ConfigurationError, match="limit must be a whole number"):
        s.plans.partitions_with_rows("pj", SLOT, 3, limit=limit)  # type: ignore[arg-type]


def test_holding_a_plan_outside_a_transaction_is_refused_instead_of_holding_nothing(store: Store) -> None:
    # Outside a transaction the share lock (PostgreSQL) ends with its statement, and SQLite takes no
    # write lock: a replan could come between the check it was to guard and the write
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        with pytest.raises(ConfigurationError, match="inside a transaction"):
            s.plans.hold("pj", SLOT)
        with s.transaction():
            s.plans.hold("pj", SLOT)
