"""Rate and ETA: one computation (core/progress.py) for the log, XCom and the row as people see it."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from airflow_resumable.core.checkpoint import Checkpoint
from airflow_resumable.core.progress import Progress, ProgressMeter, RateWindow
from airflow_resumable.core.stores import Store
from airflow_resumable.core.view import row_view

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=timezone.utc)


def export_checkpoints() -> list[tuple[float, int]]:
    """The customer export with batch_pause_seconds=10: five batches of 200, the first done at
    once (no wait before it), then one every 10 s."""
    return [(0.08, 200), (10.1, 400), (20.1, 600), (30.1, 800), (40.1, 1000)]


def test_no_rate_and_no_eta_until_two_chunk_cycles_over_a_second_were_measured() -> None:
    window = RateWindow()
    window.add(0.08, 200)
    assert window.estimate(1000) == (None, None)  # the first batch: not 2,495/s and ETA 0 s
    window.add(10.1, 400)
    assert window.estimate(1000) == (None, None)  # one cycle measured: not yet
    quick = RateWindow()
    for i in range(5):
        quick.add(0.1 * i, 10 * (i + 1))
    assert quick.estimate(1000) == (None, None)  # four cycles in 0.4 s: not yet


def test_the_rate_spans_whole_chunk_cycles_so_the_eta_counts_the_waits_between_chunks() -> None:
    window = RateWindow()
    for at, processed in export_checkpoints()[:3]:
        window.add(at, processed)
    rate, eta = window.estimate(1000)
    # At 60 %: 20/s and 20 s left, which is what is left (two more batches, 10 s apart)
    assert rate is not None and eta is not None
    assert round(rate) == 20 and round(eta) == 20


def test_the_eta_counts_down_between_checkpoints() -> None:
    window = RateWindow()
    for at, processed in export_checkpoints()[:3]:
        window.add(at, processed)
    assert round(window.estimate(1000, now=20.1 + 4)[1] or 0) == 16
    assert window.estimate(1000, now=20.1 + 60)[1] == 0.0


def test_the_same_checkpoint_seen_twice_adds_nothing_and_a_restart_starts_over() -> None:
    window = RateWindow()
    for at, processed in export_checkpoints()[:3]:
        window.add(at, processed)
        window.add(at + 1, processed)  # a later look at the same checkpoint
    assert round(window.rate() or 0) == 20
    window.add(30.0, 0)
    assert window.rate() is None


def test_the_log_line_and_the_row_view_give_the_same_numbers() -> None:
    """The row carries the holder's rate (written with the checkpoint): the view shows that number
    and the ETA from it, whichever process reads the row."""
    clock = iter(at for at, _ in export_checkpoints())
    meter = ProgressMeter(0, clock=lambda: next(clock))
    rates = [meter.observe(p) for _, p in export_checkpoints()[:3]]
    report = meter.measure(export_checkpoints()[2][1], 1000)
    assert rates[:2] == [None, None] and rates[2] == report.rate
    views = [row_view(Checkpoint(job="j.view", slot="s", processed=p, total=1000, status="running",
                                 lease_owner="w", lease_token=7, lease_expires_at=T0 + timedelta(hours=1),
                                 heartbeat_at=T0 + timedelta(seconds=at), updated_at=T0 + timedelta(seconds=at),
                                 rate=rate),
                      now=T0 + timedelta(seconds=at))
             for (at, p), rate in zip(export_checkpoints()[:3], rates, strict=True)]
    assert [v["rate"] for v in views[:2]] == [None, None]
    assert views[2]["rate"] == round(report.rate or 0, 2)
    assert views[2]["eta_seconds"] == round(report.eta or 0, 1)
    assert "rate=20/s eta=20s" in report.format()
    # a look five seconds after the checkpoint sees the ETA count down from the same rate
    at, p = export_checkpoints()[2]
    later = row_view(Checkpoint(job="j.view", slot="s", processed=p, total=1000, status="running", lease_owner="w",
                                lease_token=7, lease_expires_at=T0 + timedelta(hours=1),
                                heartbeat_at=T0 + timedelta(seconds=at), updated_at=T0 + timedelta(seconds=at),
                                rate=rates[2]), now=T0 + timedelta(seconds=at + 5))
    assert (later["rate"], later["eta_seconds"]) == (views[2]["rate"], round((report.eta or 0) - 5, 1))


def test_a_new_attempt_starts_with_no_rate_so_paused_time_is_not_counted(store: Store) -> None:
    """An attempt's start clears the rate on the row: a resumed attempt shows nothing until it has
    measured its own chunks (not 670/s · ETA 0 s after a Resume)."""
    from airflow_resumable.core import Attempt, Options, Paused

    seen: list[float | None] = []

    def work(ctx: Any) -> None:
        i = ctx.position or 0
        while i < 6:
            ctx.signal.wait(0.4)
            i += 1
            ctx.checkpoint(i, processed=i, total=6)
            with store.open() as s:
                seen.append(s.checkpoints.load(ctx.job, ctx.slot).rate)
            if i == 4 and ctx.attempt == 1:
                raise Paused("paused", "by the test")

    with pytest.raises(Paused):
        Attempt(store, job="j.rate", slot="s", attempt=1, owner="a", options=Options()).run(work)
    with store.open() as s:
        assert s.checkpoints.load("j.rate", "s").rate is not None  # the paused row keeps what was measured
    first = len(seen)
    Attempt(store, job="j.rate", slot="s", attempt=1, owner="b", options=Options()).run(work)
    # 0.4 s chunks: measured from the fourth checkpoint on (two cycles spanning over a second)
    assert first == 4 and seen[:3] == [None, None, None] and (seen[3] or 0) > 0
    assert seen[first] is None, "the resumed attempt's first checkpoint shows no rate of its own yet"


def test_the_xcom_copy_carries_the_log_lines_rate_and_eta() -> None:
    from airflow_resumable.operators.reporting import AirflowReporter

    reporter = AirflowReporter(logging.getLogger("airflow_resumable"), ti=None, interval=0, xcom_interval=0)
    progress = Progress(processed=600, total=1000, rate=20.0, eta=20.0)
    row = reporter.xcom_row(Checkpoint(job="j.xcom", slot="s", processed=600, total=1000), progress)
    assert (row["rate"], row["eta_seconds"]) == (20.0, 20.0)
    assert "rate=20/s eta=20s" in progress.format()


def test_the_row_reaches_xcom_every_xcom_interval_and_at_the_end_but_not_at_the_start(store: Store) -> None:
    from airflow_resumable.core import Attempt, Options
    from airflow_resumable.operators.reporting import XCOM_KEY, AirflowReporter

    pushes: list[tuple[str, str, int]] = []

    class PushesOnly:
        """What the reporter asks of a task instance: its ids and xcom_push."""

        dag_id, task_id = "d", "t"

        def xcom_push(self, key: str, value: Any) -> None:
            pushes.append((key, value["status"], value["processed"]))

    # Given an attempt whose XCom interval has not elapsed yet at its start and first checkpoint
    reporter = AirflowReporter(logging.getLogger("airflow_resumable"), PushesOnly(), interval=3600,
                               xcom_interval=3600)

    def work(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        assert pushes == [], "a push at the start or within the interval costs a task a round trip to Airflow"
        reporter.xcom_interval = 0  # the interval elapses
        ctx.checkpoint(2, processed=2)
        assert pushes == [(XCOM_KEY, "running", 2)]

    Attempt(store, job="j.xcom-pace", slot="s", attempt=1, owner="a", options=Options(), reporter=reporter).run(work)
    # Then the end is pushed too: the row XCom keeps for the try is the final one
    assert pushes == [(XCOM_KEY, "running", 2), (XCOM_KEY, "done", 2)]
