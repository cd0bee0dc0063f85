"""The operators' argument checks (operators/checks.py): bad arguments fail at DAG parse time naming
the task, all of them at once; a call the handler, ``read`` or ``process`` cannot take fails at parse
time, or when the task runs (mapped, ``handler_kwargs`` from XCom) without a retry and before
anything is written.

Tests marked ``one_store`` run on one store only (SQLite): a call check fails before the slot is
taken, which no store takes part in (the store contract suite owns the stores' equality).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core.stores import Store
from support.operator_runs import DAY, SLOT, _noop, row_of, ti_of
from support.xcoms import xcom


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"handler": "not callable"}, "handler must be callable"),
        ({}, "handler is required"),
        ({"handler": _noop, "overlap": "never"}, "overlap must be one of skip, allow, wait, replace"),
        ({"handler": _noop, "lease": 0.01}, "lease must be at least"),
        ({"handler": _noop, "lease_wait": -5}, "lease_wait must be a non-negative"),
        ({"handler": _noop, "timeout": 0}, "timeout must be a positive number"),
        ({"handler": _noop, "overlap_timeout": -1}, "overlap_timeout must be a non-negative"),
        ({"handler": _noop, "pipeline_checkpoints": "yes"}, "pipeline_checkpoints must be True or False"),
    ],
)
def test_bad_operator_arguments_fail_at_parse_time_naming_the_task(
    airflow_home: Path, kwargs: dict[str, Any], message: str
) -> None:
    from airflow_resumable import ResumableOperator
    from airflow_resumable.core.model.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=message) as err:
        ResumableOperator(task_id="nightly_export", **kwargs)
    assert "task 'nightly_export'" in str(err.value)


@pytest.mark.parametrize("chunk_size", [0, -1, 1.5, None])
def test_a_chunk_size_that_is_not_a_positive_int_fails_at_parse_time(airflow_home: Path, chunk_size: Any) -> None:
    from airflow_resumable import ChunkedOperator
    from airflow_resumable.core.model.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"task 'loans'.*chunk_size must be a positive integer"):
        ChunkedOperator(task_id="loans", read=lambda c, a, n: [], process=lambda c, b: None, chunk_size=chunk_size)


def _region(ctx: Any, *, region: str) -> None:
    return None


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 1e300])
@pytest.mark.parametrize(
    "argument",
    ["lease", "timeout", "lease_wait", "progress_interval", "timeout_grace", "overlap_poke", "overlap_timeout",
     "xcom_interval"],
)
def test_a_duration_that_is_nan_infinite_or_huge_fails_at_parse_time_naming_the_argument(
    airflow_home: Path, argument: str, value: float
) -> None:
    from airflow_resumable import ResumableOperator
    from airflow_resumable.core.model.errors import ConfigurationError

    # When an operator is given the value
    with pytest.raises(ConfigurationError) as err:
        ResumableOperator(task_id="nightly_export", handler=_noop, **{argument: value})
    # Then the DAG fails to parse, naming the task, the argument and the allowed range
    text = str(err.value)
    assert "task 'nightly_export'" in text and f"{argument} must be" in text and f"got {value!r}" in text
    assert "at most" in text


def test_a_lease_longer_than_a_day_is_refused_also_as_a_timedelta(airflow_home: Path) -> None:
    from datetime import timedelta

    from airflow_resumable import ResumableOperator
    from airflow_resumable.core.model.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"lease must be at least 0.3 seconds .* at most 86400 \(one day\)"):
        ResumableOperator(task_id="a", handler=_noop, lease=timedelta(days=2))
    with pytest.raises(ConfigurationError, match="timeout must be a positive number of seconds"):
        ResumableOperator(task_id="a", handler=_noop, timeout=timedelta.max)
    assert ResumableOperator(task_id="b", handler=_noop, lease=timedelta(days=1)).lease == 86400


@pytest.mark.parametrize("interval", [float("nan"), float("inf")])
def test_a_chunked_checkpoint_interval_that_is_not_finite_fails_at_parse_time(
    airflow_home: Path, interval: float
) -> None:
    from airflow_resumable import ChunkedOperator
    from airflow_resumable.core.model.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"task 'loans'.*checkpoint_interval must be a non-negative number"):
        ChunkedOperator(
            task_id="loans", read=lambda c, a, n: [], process=lambda c, b: None, chunk_size=10,
            checkpoint_interval=interval,
        )


def test_every_bad_argument_is_reported_at_once(airflow_home: Path) -> None:
    from airflow_resumable import ChunkedOperator
    from airflow_resumable.core.model.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as err:
        ChunkedOperator(
            task_id="loans", read=lambda ctx, after: [], process=lambda c, b: None, chunk_size=0,
            lease=float("nan"), xcom_interval=float("inf"),
        )
    text = str(err.value)
    for argument in ("read", "chunk_size", "lease", "xcom_interval"):
        assert f"{argument} " in text, argument


#: Python's own words for the missing keyword-only ``region``: 3.12 added "keyword-only".
MISSING_REGION = r"missing a required (keyword-only )?argument: 'region'"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"handler": _noop, "handler_kwargs": {"region": "north"}}, "got an unexpected keyword argument 'region'"),
        ({"handler": _region}, MISSING_REGION),
        ({"handler": _region, "handler_kwargs": {"regoin": "north"}}, MISSING_REGION),
        ({"handler": lambda: None}, "too many positional arguments"),
    ],
)
def test_a_handler_that_cannot_take_its_call_fails_at_parse_time(
    airflow_home: Path, kwargs: dict[str, Any], message: str
) -> None:
    from airflow_resumable import ResumableOperator
    from airflow_resumable.core.model.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=message) as err:
        ResumableOperator(task_id="export", **kwargs)
    assert "task 'export'" in str(err.value) and "cannot be called as handler(ctx" in str(err.value)


@pytest.mark.parametrize(
    ("read", "process", "message"),
    [
        (lambda ctx, after: [], lambda ctx, batch: None, r"read .*cannot be called as read\(ctx, after, limit"),
        (lambda ctx, after, limit: [], lambda batch: None, r"process .*cannot be called as process\(ctx, batch"),
        (lambda ctx, after, limit: [], lambda ctx, batch, *, region: None, MISSING_REGION),
    ],
)
def test_read_or_process_that_cannot_take_its_call_fails_at_parse_time(
    airflow_home: Path, read: Any, process: Any, message: str
) -> None:
    from airflow_resumable import ChunkedOperator
    from airflow_resumable.core.model.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=message):
        ChunkedOperator(task_id="loans", read=read, process=process, chunk_size=10)


def test_only_calls_that_cannot_work_are_refused(airflow_home: Path) -> None:
    from airflow_resumable import ChunkedOperator, ResumableOperator
    from airflow_resumable.core.model.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="unexpected keyword argument 'default'"):
        ResumableOperator(task_id="a", handler=_region, handler_kwargs={"region": "north", "default": 0})
    # max has no signature inspect can read: it is not second-guessed
    ResumableOperator(task_id="a", handler=max, handler_kwargs={"default": 0})
    # a templated value still has a known key: rendering changes values, not keys
    ResumableOperator(task_id="b", handler=_region, handler_kwargs={"region": "{{ params.region }}"})
    ChunkedOperator(
        task_id="c", read=lambda ctx, after, limit, **kw: [], process=lambda ctx, batch, **kw: None, chunk_size=1,
        handler_kwargs={"region": "north"},
    )


@pytest.mark.parametrize(
    ("job", "message"),
    [
        ("nightly\x00export", "contains a NUL character"),
        ("j" * 1025, "over the 1024 the checkpoint table's key allows"),
        ("é" * 513, "1026 bytes long in UTF-8"),
    ],
)
def test_a_job_name_the_database_cannot_store_fails_at_parse_time(airflow_home: Path, job: str, message: str) -> None:
    from airflow_resumable import ResumableOperator
    from airflow_resumable.core.model.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=message) as err:
        ResumableOperator(task_id="export", handler=_noop, job=job)
    assert "task 'export'" in str(err.value)
    ResumableOperator(task_id="templated", handler=_noop, job="{{ dag.dag_id }}" + "x" * 2000)  # checked when run


def _failed_without_retry(run: Any, task_id: str, map_index: int = -1) -> None:
    assert str(run.state) == "failed"
    ti = ti_of(run, task_id, map_index)
    assert str(ti.state) == "failed" and ti.try_number == 1, "a configuration error spends no retry"


def _no_rows(store: Store, job: str) -> None:
    with store.open() as s:
        s.ensure_schema()
        assert s.listings.list_slots(job) == [], "nothing was written"


@pytest.mark.one_store('a call check before the slot is taken')
def test_a_mapped_keyword_the_handler_does_not_take_fails_at_execute_without_retry(
    checkpoints: Store, run_dag, capfd: pytest.CaptureFixture[str]
) -> None:
    # Given a mapped task whose handler_kwargs have a typo (prat for part), known only when it runs
    run = run_dag("rt_bad_mapped_kwargs", logical_date=DAY)
    # Then it fails at once, without a retry, before taking the slot
    _failed_without_retry(run, "part", map_index=0)
    _no_rows(checkpoints, "rt_bad_mapped_kwargs.part[0]")
    text = "".join(capfd.readouterr())
    assert "cannot be called as handler(ctx, prat=...): got an unexpected keyword argument 'prat'" in text
    assert "job='rt_bad_mapped_kwargs.part[0]'" in text


@pytest.mark.one_store('an argument check before the slot is taken')
def test_a_bad_partial_argument_of_a_mapped_task_fails_without_retry(
    checkpoints: Store, run_dag, capfd: pytest.CaptureFixture[str]
) -> None:
    # Given .partial(lease=nan): not checked at parse time, only when the mapped instance is built
    run = run_dag("rt_bad_mapped_lease", logical_date=DAY)
    _failed_without_retry(run, "part", map_index=0)
    _no_rows(checkpoints, "rt_bad_mapped_lease.part[0]")
    assert "lease must be at least 0.3 seconds" in "".join(capfd.readouterr())


@pytest.mark.one_store('a call check before the slot is taken')
def test_handler_kwargs_from_an_upstream_xcom_are_checked_when_the_task_runs(
    checkpoints: Store, run_dag, capfd: pytest.CaptureFixture[str]
) -> None:
    # Given handler_kwargs pulled from an upstream task: the right key runs...
    good = run_dag("rt_xcom_kwargs", conf={"items": 4, "chunk": 2}, logical_date=DAY)
    assert str(good.state) == "success" and xcom(good, "work") == {"sum": 6, "part": 1}
    # ...and a wrong one fails at the start of execute, without a retry, writing nothing
    with checkpoints.open() as s:
        s.retention.delete("rt_xcom_kwargs.work", SLOT)
    bad = run_dag("rt_xcom_kwargs", conf={"items": 4, "chunk": 2, "key": "region"}, logical_date=DAY)
    _failed_without_retry(bad, "work")
    _no_rows(checkpoints, "rt_xcom_kwargs.work")
    assert "got an unexpected keyword argument 'region'" in "".join(capfd.readouterr())


@pytest.mark.one_store('a call check before the slot is taken')
def test_task_resumable_mapped_arguments_the_function_cannot_take_fail_without_retry(
    checkpoints: Store, run_dag, capfd: pytest.CaptureFixture[str]
) -> None:
    # Given two mapped @task.resumable calls: one passes an argument it does not take, one misses one
    run = run_dag("rt_taskflow_bad_kwargs", logical_date=DAY)
    # Then both fail without a retry, writing nothing
    for task_id in ("unexpected", "missing"):
        _failed_without_retry(run, task_id, map_index=0)
        _no_rows(checkpoints, f"rt_taskflow_bad_kwargs.{task_id}[0]")
    text = "".join(capfd.readouterr())
    assert "the @task.resumable function 'count_to' cannot take its mapped arguments: got an unexpected " \
        "keyword argument 'm'" in text
    assert "cannot be called as count_to(ctx, step=...): missing a required argument: 'n'" in text
    assert "job='rt_taskflow_bad_kwargs.missing[0]'" in text


@pytest.mark.one_store("the chunked operator's order check")
def test_a_read_in_descending_order_fails_before_processing_anything(
    checkpoints: Store, run_dag, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Given read() returns ORDER BY id DESC
    log = tmp_path / "seen.db"
    run = run_dag("rt_chunked_desc", conf={"items": 100, "seen": str(log)}, logical_date=DAY)
    # Then the task fails without a retry, nothing was processed and the checkpoint never moved
    _failed_without_retry(run, "work")
    assert not log.exists(), "no batch was processed"
    row = row_of(checkpoints, "rt_chunked_desc.work")
    assert (row.status, row.position, row.processed) == ("failed", None, 0)
    assert "read returned positions out of order: 98 (item 1 of the batch) does not come after 99" in row.last_error
    assert "ascending position order" in "".join(capfd.readouterr())
