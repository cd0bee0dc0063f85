"""Schema migrations: a first-release database upgrades in place and its slots resume; many tasks
starting at once apply each step once; a damaged or newer database is refused with the fix.

Against both stores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

import pytest

from airflow_resumable.core import Attempt, Options
from airflow_resumable.core.model.errors import SchemaVersionError
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.model.tables import all_tables
from airflow_resumable.core.stores import Store
from airflow_resumable.core.stores.migrations import MIGRATIONS, SCHEMA_VERSION
from fixtures import schema_v1


def first_release_database(store: Store, kind: str) -> None:
    with store.open() as s:
        schema_v1.create(s.conn, kind)


def columns(store: Store, kind: str, table: str) -> dict[str, bool]:
    """column -> nullable, as the database reports it."""
    with store.open() as s:
        if kind == "sqlite":
            rows = s.execute(f"PRAGMA table_info({table})").fetchall()
            return {r[1]: not r[3] and not r[5] for r in rows}
        rows = s.execute(
            "SELECT column_name, is_nullable FROM information_schema.columns WHERE table_name = %s "
            "AND table_schema = current_schema()", (table,)
        ).fetchall()
        return {name: nullable == "YES" for name, nullable in rows}


def indexes(store: Store, kind: str, table: str) -> dict[str, str]:
    """index name -> its definition, as the database reports it (schema names left out)."""
    with store.open() as s:
        if kind == "sqlite":
            rows = s.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = %s "
                             "AND sql IS NOT NULL", (table,)).fetchall()
            return {name: " ".join(sql.replace("IF NOT EXISTS ", "").split()) for name, sql in rows}
        # Each test has a schema of its own (tests/conftest.py): only this one's, its name left out.
        rows = s.execute("SELECT indexname, indexdef, schemaname FROM pg_indexes WHERE tablename = %s "
                         "AND schemaname = current_schema()", (table,)).fetchall()
        return {name: definition.replace(f"{schema}.", "") for name, definition, schema in rows}


def storage(store: Store, kind: str, table: str) -> list[str]:
    """The table's storage options (PostgreSQL's reloptions: the fill factor)."""
    if kind == "sqlite":
        return []
    with store.open() as s:
        return list(s.execute("SELECT reloptions FROM pg_class WHERE relname = %s "
                              "AND relnamespace = current_schema()::regnamespace", (table,)).fetchone()[0] or [])


def meta(store: Store) -> dict[str, str]:
    with store.open() as s:
        return dict(s.execute("SELECT key, value FROM resumable_meta").fetchall())


def test_a_first_release_database_upgrades_in_place_and_its_half_done_slot_resumes(
    store: Store, store_kind: str
) -> None:
    # Given the first release's tables with the loan report cancelled at 40 %
    first_release_database(store, store_kind)
    seen: list[int] = []

    def report(ctx) -> dict[str, Any]:
        i = ctx.position
        while i < 30000:
            seen.append(i)
            ctx.state["total"] += 14 * 3000 + 1500  # the lesson's chunk totals: 14.5 days a loan
            i += 3000
            ctx.checkpoint(i, processed=i)
        return {"total": ctx.state["total"]}

    # When the new release runs the next attempt of that slot
    run = Attempt(store, Identity(job=schema_v1.JOB, slot=schema_v1.SLOT, attempt=2, owner="new-release"))
    outcome = run.run(report)
    # Then the database was migrated, and the slot resumed from its position with its state
    assert meta(store)["schema_version"] == str(SCHEMA_VERSION)
    assert seen[0] == 12000 and outcome.resumed_from == 12000
    assert outcome.result == {"total": 435000} and outcome.checkpoint.status == "done"
    with store.open() as s:
        history = s.listings.history(schema_v1.JOB, schema_v1.SLOT)
        finished = s.checkpoints.load(schema_v1.JOB, schema_v1.DONE_SLOT)
    assert [(h.attempt, h.outcome, h.resumed_from, h.processed_start) for h in history] == [(2, "done", 12000, 12000)]
    # and the slot that had finished stays finished (no rerun, no stored result from schema 1)
    assert (finished.status, finished.state, finished.result) == ("done", {"total": 435000}, None)
    again = Attempt(
        store, Identity(job=schema_v1.JOB, slot=schema_v1.DONE_SLOT, attempt=2, owner="new-release"),
    ).run(report)
    assert again.already_done and again.result is None


def test_the_stop_reason_of_a_cancelled_slot_survives_the_rename_of_its_column(store: Store, store_kind: str) -> None:
    """Migration 6 renames ``cancel_reason`` to ``stop_reason`` (it also says why an attempt paused):
    the value a person's cancel left on the row is the renamed column's, and the old name still
    reads it, with a DeprecationWarning, for code written against the earlier releases."""
    first_release_database(store, store_kind)
    with store.open() as s:
        assert s.ensure_schema() == SCHEMA_VERSION
        row = s.checkpoints.load(schema_v1.JOB, schema_v1.SLOT)
    assert (row.status, row.stop_reason) == ("cancelled", "user")
    with pytest.warns(DeprecationWarning, match="cancel_reason is deprecated; read stop_reason"):
        assert row.cancel_reason == "user"
    # every plain-JSON copy (XCom, REST, the CLI's --json) carries both names for one more release
    plain = row.to_dict()
    assert plain["stop_reason"] == plain["cancel_reason"] == "user"


def test_a_migrated_database_has_exactly_the_columns_of_a_fresh_one(
    store: Store, store_kind: str, tmp_path, request: pytest.FixtureRequest
) -> None:
    first_release_database(store, store_kind)
    with store.open() as s:
        assert s.ensure_schema() == SCHEMA_VERSION
    migrated = {t.name: columns(store, store_kind, t.name) for t in all_tables()}
    fresh_store = _another_empty(store_kind, tmp_path, request)
    with fresh_store.open() as s:
        assert s.ensure_schema() == SCHEMA_VERSION
    fresh = {t.name: columns(fresh_store, store_kind, t.name) for t in all_tables()}
    assert migrated == fresh
    # with the same indexes (unique ones unique) and storage options
    for table in all_tables():
        assert indexes(store, store_kind, table.name) == indexes(fresh_store, store_kind, table.name), table.name
        assert storage(store, store_kind, table.name) == storage(fresh_store, store_kind, table.name), table.name
    # and both are exactly the row classes' fields, in name and nullability
    for table in all_tables():
        expected = {c.name: c.nullable and c.kind != "id" for c in table.columns}
        assert fresh[table.name] == expected, table.name
    assert "UNIQUE" in indexes(fresh_store, store_kind, "resumable_dead_letters")["resumable_dead_letters_item"]


def _another_empty(kind: str, tmp_path, request: pytest.FixtureRequest) -> Store:
    from airflow_resumable.core.stores import PostgresStore, SQLiteStore

    if kind == "sqlite":
        return SQLiteStore(tmp_path / "fresh.db")
    return PostgresStore(**request.getfixturevalue("pg_server").create_schema())


def test_many_tasks_starting_at_once_apply_each_migration_once(store: Store, store_kind: str) -> None:
    # Given a first-release database and eight tasks opening it at the same moment
    first_release_database(store, store_kind)
    barrier = threading.Barrier(8)
    results: list[Any] = []

    def first_use() -> None:
        with store.open(autocommit=True) as s:
            barrier.wait()
            try:
                results.append(s.ensure_schema())
            except Exception as exc:  # a second ALTER TABLE ... ADD COLUMN would fail here
                results.append(exc)

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # Then every one of them goes on at the current version, and the step was recorded once
    assert results == [SCHEMA_VERSION] * 8
    stamps = {k: v for k, v in meta(store).items() if k.startswith("migration:")}
    assert list(stamps) == [f"migration:{m.version}" for m in MIGRATIONS if m.version > 1]


def test_a_worker_that_may_not_migrate_is_told_the_command(store: Store, store_kind: str) -> None:
    first_release_database(store, store_kind)
    with store.open() as s, pytest.raises(SchemaVersionError,
                                          match=f"has schema version 1.*needs {SCHEMA_VERSION}") as err:
        s.ensure_schema(apply=False)
    assert "python -m airflow_resumable migrate --conn-id" in str(err.value)
    assert meta(store)["schema_version"] == "1"


def test_a_migration_that_fails_changes_nothing_and_says_why(store: Store, store_kind: str) -> None:
    # Given a first-release table that already has a column the migration adds (edited by hand)
    first_release_database(store, store_kind)
    with store.open() as s:
        s.execute("ALTER TABLE resumable_checkpoints ADD COLUMN result TEXT")
        s.commit()
    with store.open() as s, pytest.raises(SchemaVersionError,
                                          match=f"could not upgrade .* from schema 1 to {SCHEMA_VERSION}"):
        s.ensure_schema()
    # Then the step rolled back whole: still schema 1, no half-added columns, no history table
    assert meta(store)["schema_version"] == "1"
    assert "dag_id" not in columns(store, store_kind, "resumable_checkpoints")


def test_a_dropped_checkpoint_table_is_a_clear_error_with_the_way_out(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        s.execute("DROP TABLE resumable_checkpoints")
        s.commit()
    attempt = Attempt(store, Identity(job="j", slot="s", attempt=1, owner="o"), options=Options())
    with pytest.raises(SchemaVersionError, match="resumable_checkpoints is missing") as err:
        attempt.run(lambda ctx: None)
    assert "DELETE FROM resumable_meta WHERE key = 'schema_version'" in str(err.value)
    with store.open() as s:  # following the instruction recreates the tables
        s.execute("DELETE FROM resumable_meta WHERE key = 'schema_version'")
        s.commit()
    assert Attempt(store, Identity(job="j", slot="s", attempt=1, owner="o")).run(lambda ctx: 7).result == 7


def test_a_column_renamed_by_hand_is_named_with_the_recorded_version_and_the_way_back(store: Store) -> None:
    from airflow_resumable.operators.outcome import to_airflow
    from airflow_resumable.version_compat import AirflowFailException

    # Given a slot that saved a checkpoint, then someone renames a column of the checkpoint table
    def handler(ctx: Any) -> None:
        ctx.checkpoint(3, processed=3)
        raise RuntimeError("the worker died")

    with pytest.raises(RuntimeError):
        Attempt(store, Identity(job="j", slot="s", attempt=1, owner="o1")).run(handler)
    with store.open() as s:
        s.execute("ALTER TABLE resumable_checkpoints RENAME COLUMN position TO pos")
        s.commit()
    # When the next attempt starts
    with pytest.raises(SchemaVersionError) as err:
        Attempt(store, Identity(job="j", slot="s", attempt=2, owner="o2")).run(lambda ctx: None)
    # Then it is refused by name: the table, the recorded version, the column, what is there instead, the fix
    text = str(err.value)
    assert f"resumable_checkpoints in {store.describe()} does not match schema version {SCHEMA_VERSION}" in text
    assert "has no column position, and has pos, which that version does not" in text
    assert "ALTER TABLE resumable_checkpoints RENAME COLUMN pos TO position" in text
    assert isinstance(to_airflow(err.value, job="j", slot="s"), AirflowFailException)  # not retried
    # and following the instruction lets the slot resume where it was
    with store.open() as s:
        s.execute("ALTER TABLE resumable_checkpoints RENAME COLUMN pos TO position")
        s.commit()
    outcome = Attempt(store, Identity(job="j", slot="s", attempt=3, owner="o3")).run(lambda ctx: ctx.position)
    assert outcome.result == 3


def test_a_column_missing_from_another_table_is_named_too(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        s.execute("ALTER TABLE resumable_dead_letters RENAME COLUMN item_format TO kind")
        s.commit()
    with store.open() as s, pytest.raises(SchemaVersionError) as err:
        s.ensure_schema()
    assert "resumable_dead_letters" in str(err.value) and "has no column item_format, and has kind" in str(err.value)


def test_a_dropped_stamp_beside_a_live_table_is_refused_not_recreated(store: Store) -> None:
    with store.open() as s:
        s.ensure_schema()
        s.execute("DROP TABLE resumable_meta")
        s.commit()
    with store.open() as s, pytest.raises(SchemaVersionError, match="resumable_meta, which records"):
        s.ensure_schema()


def test_the_migrate_command_prints_applies_and_checks(store: Store, store_kind: str, store_uri: str) -> None:
    first_release_database(store, store_kind)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "airflow_resumable", "migrate", "--url", store_uri, *args],
                              capture_output=True, text=True, env=env, timeout=120)

    printed = cli("--sql")
    assert printed.returncode == 0, printed.stderr
    assert "ALTER TABLE resumable_checkpoints ADD COLUMN dag_id TEXT;" in printed.stdout
    assert meta(store)["schema_version"] == "1", "--sql changes nothing"
    assert cli("--check").returncode == 1
    applied = cli()
    assert applied.returncode == 0 and f"schema 1 -> {SCHEMA_VERSION}" in applied.stdout, applied.stderr
    assert cli("--check").returncode == 0
    assert json.loads(json.dumps(meta(store)))["schema_version"] == str(SCHEMA_VERSION)
    assert "password" not in applied.stdout + applied.stderr


def _first_use_in_a_process(params: dict[str, Any], start: Any, rounds: Any, answers: Any) -> None:
    """A task's first use of the store, in its own process: wait for the others, then open and check."""
    from airflow_resumable.core.stores import PostgresStore

    while (schema := rounds.get()) is not None:
        store = PostgresStore(**{**params, "options": f"-c search_path={schema}"})
        start.wait()
        try:
            with store.open(autocommit=True) as s:
                answers.put(s.ensure_schema())
        except Exception as exc:
            answers.put(f"{type(exc).__name__}: {exc}")


def test_many_processes_creating_the_schema_of_an_empty_database_at_once_all_go_on(pg_server: Any) -> None:
    # Given eight processes that open the same empty schema at the same moment, a few times over
    # (partitions' tasks starting together on a fresh database; one try in four failed before)
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    workers, tries = 8, 6
    start, rounds, answers = spawn.Barrier(workers), spawn.Queue(), spawn.Queue()
    first = pg_server.create_schema()
    params = {k: v for k, v in first.items() if k != "options"}
    schemas = [first["options"].split("search_path=", 1)[1]]
    schemas += [pg_server.create_schema()["options"].split("search_path=", 1)[1] for _ in range(tries - 1)]
    processes = [spawn.Process(target=_first_use_in_a_process, args=(params, start, rounds, answers))
                 for _ in range(workers)]
    for p in processes:
        p.start()
    try:
        for schema in schemas:
            for _ in range(workers):
                rounds.put(schema)
            # Then every one of them goes on at the current version (none sees a half-made schema)
            got = [answers.get(timeout=120) for _ in range(workers)]
            assert got == [SCHEMA_VERSION] * workers, got
    finally:
        for _ in processes:
            rounds.put(None)
        for p in processes:
            p.join(30)
            if p.is_alive():
                p.kill()
