"""Rebalancing's claims at their edges: what an idle partition must not take, and
what it must not wait for forever. On both stores."""

from __future__ import annotations

import datetime

import pytest

from airflow_resumable.core.stores import Store
from airflow_resumable.core.work import rebalance
from support.rebalancing import SLOT, run_range, split_after_10
from support.sources import Source


def test_a_range_a_person_cancelled_while_it_stopped_for_a_timeout_is_not_claimed(store: Store, source: Source) -> None:
    # Given a taken range whose runner stopped at a chunk boundary for its timeout just as a person
    # cancelled it: the row ends cancelled (timeout), the person's cancel pending on it
    from airflow_resumable.core.control import requests as control
    from airflow_resumable.core.model.errors import Cancelled

    reader, plan = split_after_10(store, source)

    def stop(n: int) -> None:
        control.cancel(store, "rb[0].1", SLOT, by="carol")
        raise Cancelled("timeout")

    with pytest.raises(Cancelled):
        run_range(store, "rb[0].1", reader, plan.current()["0.1"], during=stop)
    from airflow_resumable.core.stores.shared_sql import TABLE

    with store.open(autocommit=True) as s:
        # (run_range's attempt names no task instance: the one that ran it is map index 2)
        s.execute(f"UPDATE {TABLE} SET map_index = 2 WHERE job = 'rb[0].1'")
        row = s.checkpoints.load("rb[0].1", SLOT)
        free = rebalance.unclaimed(s, "rb", SLOT, plan)
        left = rebalance.left_by(s, "rb", SLOT, plan, 2)
    assert row is not None and (row.status, row.stop_reason, row.cancel_request) == ("cancelled", "timeout",
                                                                                       "requested")
    # Then no idle partition claims it (its attempt would only carry out the person's cancel, failing
    # a task instance that never ran the range); the task instance that ran it still takes it up
    assert [r.name for r in free] == []
    assert [r.name for r in left] == ["0.1"]


def test_a_range_whose_agreement_time_lies_far_ahead_is_not_waited_for_forever(store: Store, source: Source) -> None:
    import dataclasses

    from airflow_resumable.core.work.partitions import load_plan

    # Given a range a split took, nobody started, whose agreement time is a day ahead of this clock
    # (the victim's clock is wrong, or the plan row was edited by hand)
    _, plan = split_after_10(store, source)
    ahead = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)).isoformat(timespec="seconds")
    skewed = dataclasses.replace(plan, splits=(dataclasses.replace(plan.splits[0], when=ahead),))
    with store.open(autocommit=True) as s:
        with s.transaction():
            s.plans.hold("rb", SLOT, exclusive=True)
            s.plans.write("rb", SLOT, skewed.state())
        stored = load_plan(s, "rb", SLOT)
        assert stored is not None and stored.splits[0].when == ahead
        # Then it counts as nobody's (an idle partition claims it), not as being started for a day:
        # an idle partition without a timeout polled it until then (next_range waits while starting())
        assert [r.name for r in rebalance.unclaimed(s, "rb", SLOT, stored)] == ["0.1"]
        assert rebalance.starting(s, "rb", SLOT, stored) == []
