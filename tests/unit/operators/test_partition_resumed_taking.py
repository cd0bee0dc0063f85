"""A partition that paused on a range it took goes on with that range
(the deferral's ``taking``) only while the slot's plan still holds it as it was."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_resumable.core.stores import Store
from airflow_resumable.operators.resumable import ResumableOperator
from support.rebalancing import DAY, split_after_10
from support.sources import Source


def _operator(reader: Any) -> Any:
    from airflow.sdk import DAG

    from airflow_resumable.operators.partitioned import PartitionOperator

    with DAG("resumed_taking", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc)):
        return PartitionOperator(task_id="partition", read=reader, process=lambda ctx, batch: None, chunk_size=5,
                                 partition_group="rb", job="rb")


@pytest.mark.parametrize("forged", ["boundaries changed", "not in the plan", "a planned partition", "no plan"])
def test_a_paused_taken_range_goes_on_only_as_the_plan_holds_it(
    checkpoints: Store, source: Source, monkeypatch: pytest.MonkeyPatch, forged: str
) -> None:
    from airflow_resumable.version_compat import AirflowFailException

    # Given a plan whose range 0 a split cut after id 10 (the taken range "0.1": ids 11..40)
    reader, plan = split_after_10(checkpoints, source)
    taken = plan.current()["0.1"]
    if forged == "boundaries changed":  # the plan split anew while it waited, or kwargs edited
        taking = dataclasses.replace(taken, after=0).as_json()
    elif forged == "not in the plan":
        taking = dataclasses.replace(taken, split=7).as_json()
    elif forged == "a planned partition":  # "split" dropped: the job is partition 0's own
        taking = {k: v for k, v in taken.as_json().items() if k != "split"}
    else:
        taking = taken.as_json()
        with checkpoints.open(autocommit=True) as s:
            s.execute("DELETE FROM resumable_checkpoints WHERE job = 'rb#plan'")
    ran: list[Any] = []
    monkeypatch.setattr(ResumableOperator, "_run", lambda self, context, **kw: ran.append(self._taking) or {})
    op = _operator(reader)
    op.rebalance = False  # (no more work looked for after it)
    ti = SimpleNamespace(map_index=1, try_number=1, dag_id="resumed_taking", task_id="partition", run_id="r")
    context = {"logical_date": DAY, "run_id": "r", "ti": ti}

    # When its deferral ends with that range as the one it paused on
    # Then it runs nothing of it, and fails saying why
    with pytest.raises(AirflowFailException, match="plan"):
        op.execute_resumed(context, {"event": "resumed", "why": "resumed"}, 0.0, taking=taking)
    assert ran == []
