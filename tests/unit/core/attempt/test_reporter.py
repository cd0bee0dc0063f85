"""Rate, ETA and percent: one computation each (the rate in core/attempt/reporter.py, the ETA and the percent in
core/view.py) for the log, XCom, the task state store, the task's return value and the row as people see it."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from airflow_resumable.core.attempt.reporter import Progress, ProgressMeter, RateWindow
from airflow_resumable.core.model.checkpoint import Checkpoint
from airflow_resumable.core.model.identity import Identity
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
        Attempt(store, Identity(job="j.rate", slot="s", attempt=1, owner="a"), options=Options()).run(work)
    with store.open() as s:
        assert s.checkpoints.load("j.rate", "s").rate is not None  # the paused row keeps what was measured
    first = len(seen)
    Attempt(store, Identity(job="j.rate", slot="s", attempt=1, owner="b"), options=Options()).run(work)
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


def test_every_shape_of_a_row_whose_total_was_edited_below_its_count_shows_100_percent() -> None:
    """Given a row that processed 150 items of a total edited by hand to 100, When it goes out in
    each shape, Then each shows 100 %, as the log line does: one percent, capped (the task state
    store's summary showed 150 % before it took the view's)."""
    from airflow_resumable.core import view

    row = Checkpoint(job="j.over", slot="s", processed=150, total=100, status="running", updated_at=T0)
    xcom, _, _ = view.xcom_row(row)
    shown = [xcom["percent"], view.row_view(row, now=T0)["percent"], view.listed_row(row, now=T0)["percent"],
             view.state_store_summary(row, link="tab")["percent"], view.percent_of(row.processed, row.total)]
    assert shown == [100.0] * 5
    assert Progress(processed=150, total=100, rate=None, eta=None).format().startswith("100% ")
    assert view.percent_of(1, 3) == 33.33 and view.percent_of(5, 0) is None and view.percent_of(5, None) is None
    assert "percent" not in row.to_dict()  # the row's columns only; its shapes add the percent
    with pytest.warns(DeprecationWarning, match="Checkpoint.percent is deprecated"):
        assert row.percent == 100.0


def test_a_value_over_its_channels_limit_is_cut_by_one_rule_whatever_the_channel() -> None:
    """Given a position whose JSON is longer than every channel's limit, When a row holding it goes
    to XCom, to the REST listing and to the task state store, Then each gives
    ``{marker: true, "bytes": n, "preview": <the first limit characters>...}``, only the marker
    (``xcom_truncated`` in XCom, as documented; ``truncated`` elsewhere) and the limit differing;
    the task's return value gives it whole."""
    from airflow_resumable.core import view

    position = {"key": "k" * 70_000}
    text = __import__("json").dumps(position)
    row = Checkpoint(job="j.cut", slot="s", position=position, processed=1, total=2, updated_at=T0)
    xcom, size, cut = view.xcom_row(row)
    listed = view.listed_row(row, now=T0)
    stored = view.state_store_summary(row, link="tab")["position"]
    assert size > view.ROW_LIMIT and cut == {"position": len(text)} and xcom["xcom_truncated"] == ["position"]
    assert xcom["position"] == {"xcom_truncated": True, "bytes": len(text), "preview": text[:200] + "..."}
    assert listed["position"] == {"truncated": True, "bytes": len(text), "preview": text[:200] + "..."}
    assert listed["truncated"] == ["position"]
    limit = view.STATE_STORE_POSITION_LIMIT
    assert stored == {"truncated": True, "bytes": len(text), "preview": text[:limit] + "..."}
    assert view.task_summary(row)["position"] == position
    # A value exactly at a channel's limit goes whole
    at_limit = "x" * (limit - 2)  # its JSON: the quotes make it limit characters
    assert view.state_store_summary(Checkpoint(job="j", slot="s", position=at_limit), link="")["position"] == at_limit


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
        assert pushes == [(XCOM_KEY, "checkpointed", 2)]

    Attempt(
        store, Identity(job="j.xcom-pace", slot="s", attempt=1, owner="a"), options=Options(), reporter=reporter,
    ).run(work)
    # Then the end is pushed too: the row XCom keeps for the try is the final one
    assert pushes == [(XCOM_KEY, "checkpointed", 2), (XCOM_KEY, "done", 2)]


def test_after_a_failed_push_the_checkpoints_pushes_pause_and_the_end_is_pushed_still(store: Store) -> None:
    """Given an attempt whose task cannot reach Airflow's API server (each push fails, after about
    20 s of the supervisor's retries on the task's main thread), When it checkpoints every moment,
    Then one checkpoint tries a push and the next ones do not, until the pause is over; the end is
    tried still; a push that goes through again resumes the pace."""
    from airflow_resumable.core import Attempt, Options
    from airflow_resumable.operators import reporting

    tried: list[str] = []

    class Unreachable:
        dag_id, task_id = "d", "t"
        up = False

        def xcom_push(self, key: str, value: Any) -> None:
            tried.append(value["status"])
            if not self.up:
                raise ConnectionError("the API server is unreachable")

    ti = Unreachable()
    reporter = reporting.AirflowReporter(logging.getLogger("airflow_resumable"), ti, interval=3600, xcom_interval=0)

    def work(ctx: Any) -> None:
        for i in range(1, 6):
            ctx.checkpoint(i, processed=i)
        assert tried == ["checkpointed"], "every checkpoint after a failed push paid for another one"
        reporter._paused_until = 0.0  # the pause is over
        ti.up = True
        ctx.checkpoint(6, processed=6)
        ctx.checkpoint(7, processed=7)

    Attempt(store, Identity(job="j.xcom-down", slot="s", attempt=1, owner="a"), options=Options(),
            reporter=reporter).run(work)
    assert tried == ["checkpointed", "checkpointed", "checkpointed", "done"]


def _running(processed: int, *, updated_at: datetime, rate: float | None, total: int | None = 1000) -> Checkpoint:
    return Checkpoint(job="j.stall", slot="s", processed=processed, total=total, status="running", lease_owner="w",
                      lease_token=1, lease_expires_at=updated_at + timedelta(hours=1), heartbeat_at=updated_at,
                      updated_at=updated_at, rate=rate)


def test_a_chunk_stuck_past_its_eta_is_shown_stalled_since_its_last_checkpoint_not_eta_0() -> None:
    # Given a running slot at 600 of 1,000 at 20/s (20 s left at its last checkpoint), its lease live
    row = _running(600, updated_at=T0, rate=20.0)
    # When people look before, at and just past the ETA, the ETA counts down to 0
    assert [row_view(row, now=T0 + timedelta(seconds=s))["eta_seconds"] for s in (5, 20, 21)] == [15.0, 0.0, 0.0]
    assert row_view(row, now=T0 + timedelta(seconds=21))["stalled_since"] is None
    # Then once it ran out more than the grace ago with no checkpoint, it says since when it is stuck
    late = row_view(row, now=T0 + timedelta(minutes=30))
    assert (late["eta_seconds"], late["stalled_since"]) == (None, T0.isoformat())
    assert late["rate"] == 20.0 and late["lease"] == "live"
    # and a slot with no rate measured yet, or no total, or not running, is never called stalled
    for quiet in (_running(600, updated_at=T0, rate=None), _running(600, updated_at=T0, rate=20.0, total=None)):
        assert row_view(quiet, now=T0 + timedelta(hours=2))["stalled_since"] is None


def test_a_frozen_chunk_with_a_live_lease_shows_stalled_since_in_the_command_lines_row_view(
    checkpoints: Store, airflow_home: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import threading
    import time

    from airflow_resumable.core import Attempt, Options
    from support.module_cli import run_module_cli

    # Given a real attempt that checkpointed four quick chunks of 10 (a rate measured, its total
    # known) and is now stuck in its fifth, its lease keeper still renewing the lease
    release, frozen = threading.Event(), threading.Event()

    def work(ctx: Any) -> None:
        i = ctx.position or 0
        while i < 100:
            if i == 40:
                frozen.set()
                release.wait(120)
            ctx.signal.wait(0.4)
            i += 10
            ctx.checkpoint(i, processed=i, total=100)

    runner = threading.Thread(target=lambda: Attempt(
        checkpoints, Identity(job="j.stall", slot="s", attempt=1, owner="w"), options=Options(lease=3.0),
    ).run(work))
    runner.start()
    try:
        assert frozen.wait(60)

        def show() -> dict[str, Any]:
            assert run_module_cli(["show", "j.stall", "s", "--output", "json"]) == 0
            return json.loads(capsys.readouterr().out)

        # When people look at it while its ETA counts down (a second after its last checkpoint: 60
        # items left at about 25/s) and after it ran out (2.4 s, then the grace)
        with checkpoints.open() as s:
            row = s.checkpoints.load("j.stall", "s")
        assert row is not None and row.updated_at is not None
        early = row_view(row, now=row.updated_at + timedelta(seconds=1))
        assert early["rate"] and early["eta_seconds"] and early["stalled_since"] is None
        deadline = time.monotonic() + 60
        view = show()
        while view["stalled_since"] is None:
            assert time.monotonic() < deadline, view
            time.sleep(0.2)
            view = show()
        # Then the row view (the one the tab, REST and the command line show) says it is stalled since
        # its last checkpoint, with the lease still live, instead of ETA 0 forever
        assert view["eta_seconds"] is None and view["lease"] == "live" and view["status"] == "running"
        assert view["stalled_since"] == view["updated_at"]
        assert run_module_cli(["show", "j.stall", "s"]) == 0
        assert "stalled_since" in capsys.readouterr().out
    finally:
        release.set()
        runner.join(60)
