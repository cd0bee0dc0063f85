"""The operators in real Airflow DAG runs (dag.test()), against both checkpoint stores.

Tests marked ``one_store`` run on one store only (SQLite, the faster): what they assert is about
Airflow and the operator, not the store, whose equality the store contract suite
(tests/unit/core/stores/test_store_contract.py) owns: the job key and slot of mapped tasks and of runs without a
logical date, the signal's timeout, the chunked operator's and the decorator's loop, summary and
order check, and the call and argument checks that fail before the slot is taken. The XCom row
test always ran on PostgreSQL (it needs a login with a password): it now runs once, not twice.
Every test that asserts what a store keeps (resume, restart, the end-of-run window, a stored
result, sinks written through ctx.transaction(), a huge state, pipelined writes) runs on both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core.stores import Store
from support.operator_runs import DAY, SLOT, _noop, row_of, seen, ti_of
from support.xcoms import xcom


def test_a_retry_resumes_at_the_failed_chunk(checkpoints: Store, run_dag, tmp_path: Path) -> None:
    log = tmp_path / "seen.db"
    run = run_dag("rt_items", conf={"items": 40, "chunk": 5, "fail": [1, 3], "seen": str(log)}, logical_date=DAY)
    assert str(run.state) == "success"
    events = seen(log)
    attempt1 = [i for i, a in events if a == 1]
    attempt2 = [i for i, a in events if a == 2]
    assert attempt1 == list(range(0, 20))  # chunks 0-2 checkpointed, chunk 3 failed mid-way
    assert attempt2 == list(range(15, 40))  # resumed at chunk 3: only its items twice
    row = row_of(checkpoints, "rt_items.work")
    assert (row.status, row.processed, row.total, row.attempt, row.attempts) == ("done", 40, 40, 2, 2)
    assert row.state == {"sum": sum(range(40))}
    assert xcom(run, "work") == {"sum": sum(range(40)), "part": 0}
    assert ti_of(run, "work").try_number == 2


def test_with_pipelined_checkpoints_a_retry_resumes_after_the_last_chunk_and_done_is_stored(
    checkpoints: Store, run_dag, tmp_path: Path
) -> None:
    log = tmp_path / "seen.db"
    run = run_dag("rt_pipelined", conf={"items": 40, "chunk": 5, "fail": [1, 3], "seen": str(log)}, logical_date=DAY)
    assert str(run.state) == "success"
    # the failure let chunk 2's checkpoint (in flight) finish first: the retry resumes at chunk 3
    assert [i for i, a in seen(log) if a == 2] == list(range(15, 40))
    row = row_of(checkpoints, "rt_pipelined.work")
    assert (row.status, row.processed, row.attempts, row.state) == ("done", 40, 2, {"sum": sum(range(40))})
    assert xcom(run, "work") == {"sum": sum(range(40)), "part": 0}


def test_running_a_failed_slot_again_continues_it_as_a_clear_does(checkpoints: Store, run_dag, tmp_path: Path) -> None:
    log = tmp_path / "seen.db"
    conf = {"items": 30, "chunk": 5, "fail": [1, 2], "seen": str(log)}
    first = run_dag("rt_no_retry", conf=conf, logical_date=DAY)
    assert str(first.state) == "failed"
    failed = row_of(checkpoints, "rt_no_retry.work")
    assert (failed.status, failed.position) == ("failed", 10) and "injected failure in chunk 2" in failed.last_error
    again = run_dag("rt_no_retry", conf={**conf, "fail": None}, logical_date=DAY)
    assert str(again.state) == "success"
    assert [i for i, _ in seen(log)] == list(range(0, 15)) + list(range(10, 30))
    done = row_of(checkpoints, "rt_no_retry.work")
    assert (done.status, done.processed, done.resumed_from, done.attempts) == ("done", 30, 10, 2)


def test_the_restart_flag_discards_an_unfinished_checkpoint(checkpoints: Store, run_dag, tmp_path: Path) -> None:
    log = tmp_path / "seen.db"
    conf = {"items": 20, "chunk": 5, "fail": [1, 2], "seen": str(log)}
    assert str(run_dag("rt_no_retry", conf=conf, logical_date=DAY).state) == "failed"
    run = run_dag("rt_no_retry", conf={**conf, "fail": None, "resumable_restart": True}, logical_date=DAY)
    assert str(run.state) == "success"
    assert [i for i, _ in seen(log)] == list(range(0, 15)) + list(range(0, 20))
    assert row_of(checkpoints, "rt_no_retry.work").resumed_from is None


@pytest.mark.one_store("the signal's timeout and Airflow's retries")
def test_the_cooperative_timeout_fails_the_attempt_and_retries_finish_exactly(
    checkpoints: Store, run_dag, tmp_path: Path
) -> None:
    log = tmp_path / "seen.db"
    run = run_dag("rt_timeout", conf={"items": 24, "chunk": 2, "sleep": 0.15, "seen": str(log)}, logical_date=DAY)
    assert str(run.state) == "success"
    items = [i for i, _ in seen(log)]
    assert sorted(items) == list(range(24)), "a cooperative timeout stops after a checkpoint: nothing repeats"
    assert ti_of(run, "work").try_number >= 2
    row = row_of(checkpoints, "rt_timeout.work")
    assert row.state == {"sum": sum(range(24))} and row.status == "done"


@pytest.mark.one_store('the job key of a mapped task')
def test_mapped_tasks_keep_one_checkpoint_per_map_index(checkpoints: Store, run_dag, tmp_path: Path) -> None:
    log = tmp_path / "seen.db"
    run = run_dag("rt_mapped", conf={"items": 10, "chunk": 5, "fail": [1, 1], "seen": str(log)}, logical_date=DAY)
    assert str(run.state) == "success"
    for part in range(3):
        row = row_of(checkpoints, f"rt_mapped.part[{part}]")
        assert (row.status, row.processed, row.attempts) == ("done", 10, 2)
        assert [i for i, a in seen(log, part) if a == 2] == list(range(5, 10))
        assert xcom(run, "part", map_index=part) == {"sum": 45, "part": part}


@pytest.mark.one_store('the slot of a run without a logical date')
def test_a_run_without_a_logical_date_uses_its_run_id_as_slot(checkpoints: Store, run_dag) -> None:
    run = run_dag("rt_manual", conf={"items": 5, "chunk": 5}, logical_date=None)
    assert str(run.state) == "success"
    with checkpoints.open() as s:
        rows = s.listings.list_slots("rt_manual.work")
    assert [r.slot for r in rows] == [run.run_id]


@pytest.mark.one_store('it always runs on PostgreSQL (a login with a password)', kind='postgres')
def test_the_checkpoint_row_is_in_xcom_as_plain_json_without_credentials(
    store_kind: str, pg_params: dict[str, Any], run_dag, monkeypatch: pytest.MonkeyPatch
) -> None:
    from devtools.postgres import Server, dsn

    # Given a PostgreSQL login with a password (trust auth ignores it, but it is in the connection)
    uri = dsn({**pg_params, "password": "s3cr3t-pw"})
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", uri)
    run = run_dag("rt_items", conf={"items": 10, "chunk": 5}, logical_date=DAY)
    assert str(run.state) == "success"
    cp = xcom(run, "work", key="checkpoint")
    assert cp["job"] == "rt_items.work" and cp["slot"] == SLOT
    assert (cp["status"], cp["processed"], cp["total"], cp["percent"]) == ("done", 10, 10, 100.0)
    assert isinstance(cp["updated_at"], str) and cp["lease_owner"] is None
    assert "s3cr3t-pw" not in repr(cp)
    summary = xcom(run, "work")
    assert summary == {"sum": 45, "part": 0}
    del Server


@pytest.mark.one_store("the chunked operator's loop and summary")
def test_the_chunked_operator_resumes_and_returns_a_summary(checkpoints: Store, run_dag, tmp_path: Path) -> None:
    log = tmp_path / "seen.db"
    run = run_dag("rt_chunked", conf={"items": 20, "fail": [1, 2], "seen": str(log)}, logical_date=DAY)
    assert str(run.state) == "success"
    assert [i for i, a in seen(log) if a == 2] == list(range(8, 20))
    summary = xcom(run, "work")
    assert summary == {
        "job": "rt_chunked.work", "slot": SLOT, "position": 19, "processed": 20, "total": 20,
        "status": "done", "attempts": 2, "resumed_from": 7,
    }


@pytest.mark.one_store("the decorator's plumbing")
def test_task_resumable_is_the_taskflow_twin(checkpoints: Store, run_dag, tmp_path: Path) -> None:
    log = tmp_path / "seen.db"
    run = run_dag("rt_taskflow", conf={"items": 12, "fail": True, "seen": str(log)}, logical_date=DAY)
    assert str(run.state) == "success"
    assert xcom(run, "count_up") == {"sum": sum(range(12)), "n": 12}
    assert [i for i, a in seen(log) if a == 2] == list(range(6, 12))
    row = row_of(checkpoints, "rt_taskflow.count_up")
    assert (row.status, row.resumed_from) == ("done", 6)


def test_a_missing_connection_fails_without_retry_and_says_how_to_configure_it(
    airflow_home: Path, run_dag, capfd: pytest.CaptureFixture[str]
) -> None:
    run = run_dag("rt_conn", conf={}, logical_date=DAY)
    assert str(run.state) == "failed"
    ti = ti_of(run, "work")
    assert ti.try_number == 1, "a configuration error is not retried"
    out, err = capfd.readouterr()
    text = out + err
    assert "'resumable_missing' for the checkpoint store does not exist" in text
    assert "AIRFLOW_CONN_RESUMABLE_MISSING='sqlite:////" in text and "job='rt_conn.work'" in text


def test_the_operator_takes_exactly_the_declared_arguments_keyword_only_with_their_defaults(airflow_home: Path) -> None:
    """The signature is written out for Airflow (default_args, .partial/.expand checks) and IDEs;
    this keeps it equal to the declarations in core/model/options.py, so a missed place fails here."""
    import inspect

    from airflow_resumable import ResumableOperator
    from airflow_resumable.core.model.options import ARGUMENTS
    from airflow_resumable.decorators.resumable import _ResumableDecoratedOperator

    params = {n: p for n, p in inspect.signature(ResumableOperator.__init__).parameters.items()
              if p.kind is not inspect.Parameter.VAR_KEYWORD and n != "self"}
    assert set(params) == set(ARGUMENTS)
    for name, param in params.items():
        declared = ARGUMENTS[name]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY, name
        assert param.default == declared.default and type(param.default) is type(declared.default), name
        # A duration takes seconds or a timedelta (stored as seconds); nothing else takes a timedelta.
        assert ("timedelta" in str(param.annotation)) == declared.seconds, name
        assert f":param {name}: " in (ResumableOperator.__doc__ or ""), name
    templated = [a.name for a in ARGUMENTS.values() if a.templated]
    assert list(ResumableOperator.template_fields) == templated == ["job", "restart", "handler_kwargs"]
    assert list(_ResumableDecoratedOperator.template_fields) == ["op_args", "op_kwargs", "job", "restart"]
    # The class's attribute types (for the arguments it reads itself) name declared arguments only.
    assert set(ResumableOperator.__annotations__) - {"template_fields"} <= set(ARGUMENTS)
    # Each is stored by a line of its own, a duration through _seconds (read as written, no loop)
    source = inspect.getsource(ResumableOperator.__init__)
    for name, declared in ARGUMENTS.items():
        stored = f"self.{name} = _seconds({name})" if declared.seconds else f"self.{name} = {name}"
        assert f"        {stored}\n" in source, name


def test_the_chunked_operator_and_loop_take_exactly_their_declared_arguments_keyword_only_with_their_defaults(
    airflow_home: Path,
) -> None:
    """ChunkedOperator's own arguments and chunk_loop's are core/work/chunk_loop.py's CHUNKED_OPTIONS: the
    signatures (written out for Airflow and IDEs), the docstring and the stored attributes."""
    import inspect
    from datetime import timedelta

    from airflow_resumable import ChunkedOperator
    from airflow_resumable.core.work.chunk_loop import CHUNKED_OPTIONS, chunk_loop

    declared = {o.name: o for o in CHUNKED_OPTIONS}
    params = {n: p for n, p in inspect.signature(ChunkedOperator.__init__).parameters.items()
              if p.kind is not inspect.Parameter.VAR_KEYWORD and n != "self"}
    assert list(params) == list(declared)
    loop = inspect.signature(chunk_loop).parameters
    assert list(loop) == list(declared)
    for name, param in params.items():
        option = declared[name]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY, name
        assert param.default == option.default and type(param.default) is type(option.default), name
        assert loop[name].default == option.default and type(loop[name].default) is type(option.default), name
        assert ("timedelta" in str(param.annotation)) == option.seconds, name
        assert f":param {name}: " in (ChunkedOperator.__doc__ or ""), name
        assert f"\n        {name}: " in (chunk_loop.__doc__ or ""), name
    assert set(ChunkedOperator.__annotations__) == set(declared)
    source = inspect.getsource(ChunkedOperator.__init__)
    for name, option in declared.items():
        assert (f"self.{name} = _seconds({name})" if option.seconds else f"self.{name} = {name}") in source, name
    op = ChunkedOperator(task_id="c", read=lambda ctx, after, limit: [], process=lambda ctx, batch: None,
                         chunk_size=3, checkpoint_interval=timedelta(seconds=2), skip_on=ValueError, skip_limit=4)
    assert (op.chunk_size, op.checkpoint_interval, op.skip_on, op.skip_limit) == (3, 2.0, ValueError, 4)


def test_every_declared_duration_is_stored_in_seconds_under_its_own_name(airflow_home: Path) -> None:
    from datetime import timedelta

    from airflow_resumable import ResumableOperator
    from airflow_resumable.core.model.options import ARGUMENTS

    durations = [a.name for a in ARGUMENTS.values() if a.seconds]
    assert len(durations) == 12
    op = ResumableOperator(task_id="a", handler=_noop, **{name: timedelta(seconds=2 + i) for i, name in enumerate(durations)})
    assert [getattr(op, name) for name in durations] == [2.0 + i for i in range(len(durations))]


def test_the_decorator_takes_every_declared_argument_and_stores_it_as_the_operator_does(airflow_home: Path) -> None:
    """@task.resumable passes its arguments through to ResumableOperator: nothing to keep in step."""
    from datetime import timedelta

    from airflow.sdk import DAG

    from airflow_resumable.core.model.options import ARGUMENTS
    from airflow_resumable.decorators.resumable import resumable_task

    durations = [a.name for a in ARGUMENTS.values() if a.seconds]
    with DAG("decorated", schedule=None):
        @resumable_task(job="decorated.job", overlap="wait", **{n: timedelta(seconds=2 + i) for i, n in enumerate(durations)})
        def work(ctx: Any) -> None:
            pass

        op: Any = work().operator
    assert [getattr(op, name) for name in durations] == [2.0 + i for i in range(len(durations))]
    assert (op.job, op.overlap, op.handler) == ("decorated.job", "wait", op.resumable_fn)


def test_timeout_sets_an_execution_timeout_backstop_unless_one_is_given(airflow_home: Path) -> None:
    from datetime import timedelta

    from airflow_resumable import ResumableOperator

    backstop = ResumableOperator(task_id="a", handler=_noop, timeout=timedelta(minutes=50))
    assert backstop.execution_timeout == timedelta(minutes=51)
    explicit = ResumableOperator(task_id="b", handler=_noop, timeout=600, execution_timeout=timedelta(hours=2))
    assert explicit.execution_timeout == timedelta(hours=2)
    assert ResumableOperator(task_id="c", handler=_noop).execution_timeout is None


def test_on_kill_outside_a_run_is_a_no_op(airflow_home: Path) -> None:
    from airflow_resumable import ResumableOperator

    ResumableOperator(task_id="a", handler=_noop).on_kill()


@pytest.mark.one_store("the mapped kwargs' plumbing")
def test_a_mapped_chunked_operator_passes_handler_kwargs_to_read_and_process(checkpoints: Store, run_dag) -> None:
    run = run_dag("rt_chunked_mapped", logical_date=DAY)
    assert str(run.state) == "success"
    north = row_of(checkpoints, "rt_chunked_mapped.region[0]")
    south = row_of(checkpoints, "rt_chunked_mapped.region[1]")
    assert (north.state, north.processed) == ({"north": 7}, 7)
    assert (south.state, south.processed) == ({"south": 4}, 4)


def sink_rows(store: Store) -> list[tuple[int, int]]:
    with store.open() as s:
        return [tuple(r) for r in s.execute("SELECT item, attempt FROM rt_sink ORDER BY item, attempt").fetchall()]


def test_a_failure_after_the_slot_is_done_is_retried_without_redoing_the_work(
    checkpoints: Store, run_dag, capfd: pytest.CaptureFixture[str]
) -> None:
    # Given a task that writes 30 items exactly once through ctx.transaction() and then fails in
    # the end-of-run window (after its slot is done, before Airflow records success), with retries
    run = run_dag("rt_end_window", conf={"items": 30, "fail_after_done": True}, logical_date=DAY)
    # Then Airflow's retry finds the slot done: it succeeds with the stored result, redoing nothing
    assert str(run.state) == "success"
    assert ti_of(run, "work").try_number == 2
    assert sink_rows(checkpoints) == [(i, 1) for i in range(30)]
    assert xcom(run, "work") == {"items": 30, "attempt": 1}
    row = row_of(checkpoints, "rt_end_window.work")
    assert (row.status, row.runs, row.attempt, row.result) == ("done", 1, 1, {"items": 30, "attempt": 1})
    assert row.confirmed_at is not None  # Airflow recorded try 2's success
    with checkpoints.open() as s:
        history = [(h.attempt, h.outcome, h.run_id, h.task_id) for h in s.listings.history("rt_end_window.work", SLOT)]
    assert history == [(1, "done", run.run_id, "work"), (2, "already_done", run.run_id, "work")]
    out, err = capfd.readouterr()
    assert f"already finished at {row.finished_at.isoformat()} (run {run.run_id}, attempt 1" in out + err


def test_a_return_value_that_cannot_be_stored_fails_before_done_and_spends_no_retry(
    checkpoints: Store, run_dag
) -> None:
    run = run_dag("rt_end_window", conf={"items": 30, "result": "object"}, logical_date=DAY)
    assert str(run.state) == "failed"
    assert ti_of(run, "work").try_number == 1, "a retry cannot fix the handler's return value"
    assert sink_rows(checkpoints) == [(i, 1) for i in range(30)]
    row = row_of(checkpoints, "rt_end_window.work")
    assert (row.status, row.position, row.result) == ("failed", 30, None)
    assert "cannot be stored" in row.last_error and "not marked done" in row.last_error


def test_a_new_run_of_a_finished_slot_gets_its_stored_outcome_and_the_restart_flag_runs_it_again(
    checkpoints: Store, run_dag, tmp_path: Path
) -> None:
    log = tmp_path / "seen.db"
    conf = {"items": 10, "chunk": 5, "seen": str(log)}
    first = run_dag("rt_items", conf=conf, logical_date=DAY)
    again = run_dag("rt_items", conf=conf, logical_date=DAY)  # a new DAG run for the same date
    assert str(again.state) == "success" and again.run_id != first.run_id
    assert [i for i, _ in seen(log)] == list(range(10)), "the finished slot was not run again"
    assert xcom(again, "work") == {"sum": 45, "part": 0}
    assert row_of(checkpoints, "rt_items.work").runs == 1
    restarted = run_dag("rt_items", conf={**conf, "resumable_restart": True}, logical_date=DAY)
    assert str(restarted.state) == "success"
    assert [i for i, _ in seen(log)] == list(range(10)) * 2
    assert row_of(checkpoints, "rt_items.work").runs == 2


@pytest.mark.one_store('the job key of a mapped task')
def test_mapped_tasks_under_one_job_name_still_keep_one_checkpoint_per_partition(
    checkpoints: Store, run_dag, tmp_path: Path
) -> None:
    log = tmp_path / "seen.db"
    run = run_dag("rt_mapped_shared_job", conf={"seen": str(log)}, logical_date=DAY)
    assert str(run.state) == "success"
    for part in (0, 1):
        assert [i for i, _ in seen(log, part)] == list(range(part * 100, part * 100 + 10))
        row = row_of(checkpoints, f"regions[{part}]")
        assert (row.status, row.position, row.processed, row.map_index) == ("done", part * 100 + 10, 10, part)
    assert row_of(checkpoints, "regions") is None


def test_a_chunked_task_retried_after_done_returns_the_same_summary(checkpoints: Store, run_dag, tmp_path: Path) -> None:
    log = tmp_path / "seen.db"
    run = run_dag("rt_chunked_end_window", conf={"items": 10, "seen": str(log), "fail_after_done": True},
                  logical_date=DAY)
    assert str(run.state) == "success" and ti_of(run, "work").try_number == 2
    assert [i for i, _ in seen(log)] == list(range(10))
    assert xcom(run, "work") == {
        "job": "rt_chunked_end_window.work", "slot": SLOT, "position": 9, "processed": 10, "total": None,
        "status": "done", "attempts": 1, "resumed_from": None,
    }


def test_a_huge_state_reaches_xcom_as_a_preview_and_stays_whole_in_the_row(
    checkpoints: Store, run_dag, capfd: pytest.CaptureFixture[str]
) -> None:
    from airflow_resumable.operators.resumable import XCOM_ROW_LIMIT

    # A small state goes whole
    small = xcom(run_dag("rt_big_state", conf={"kib": 1}, logical_date=DAY), "work", key="checkpoint")
    assert "xcom_truncated" not in small and small["state"] == {"blob": "x" * 1024, "n": 3}
    capfd.readouterr()
    # Given a handler that checkpoints a 200 KiB state three times, pushing the row each time
    run = run_dag("rt_big_state", conf={"kib": 200, "resumable_restart": True}, logical_date=DAY)
    assert str(run.state) == "success"
    # Then XCom holds a small row: the state cut to a preview with its size
    cp = xcom(run, "work", key="checkpoint")
    assert len(__import__("json").dumps(cp)) < XCOM_ROW_LIMIT
    assert cp["xcom_truncated"] == ["state"] and (cp["position"], cp["processed"], cp["status"]) == (3, 3, "done")
    assert cp["state"]["xcom_truncated"] is True and cp["state"]["bytes"] > 200 * 1024
    assert cp["state"]["preview"].startswith('{"blob": "xxx')
    # And the row in the database is whole
    assert row_of(checkpoints, "rt_big_state.work").state == {"blob": "x" * 200 * 1024, "n": 3}
    # And the log says so once per attempt, naming where the whole row is
    text = "".join(capfd.readouterr())
    assert text.count("over the 64 KiB XCom limit") == 1
    assert "the whole row is in the resumable_checkpoints table of" in text
