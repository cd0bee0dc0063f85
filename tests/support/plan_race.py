"""A replan racing a request to a partition: the request is held between its check against the
plan and its write while another connection splits the job anew (tests/unit/test_plan_requests.py,
tests/unit/core/control/test_requests_outside_plan.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from airflow_resumable.core.control import requests as core_control
from airflow_resumable.core.stores import Store
from airflow_resumable.core.work.partitions import Plan, replace_plan


def replan_while_checked(store: Store, job: str, slot: str, partition: str, ask: Callable[[], Any],
                         monkeypatch: pytest.MonkeyPatch) -> tuple[bool, list[BaseException]]:
    """Run ``ask()`` on a thread of its own; once its check of ``partition`` against ``job``'s plan
    has run (the one check, :func:`~airflow_resumable.core.control.requests.held_in_plan`), hold it
    there and split the job anew into 2 on another thread (a restart of ``<job>#plan``, then the new
    plan); let the request go on after the replan has had 5 s to go first. Returns whether the
    replan was still waiting then, and what either thread raised."""
    checked, go = threading.Event(), threading.Event()
    check = core_control.outside_plan

    def check_then_wait(load, name, at):  # type: ignore[no-untyped-def]
        found = check(load, name, at)
        if name == partition and not checked.is_set():
            checked.set()
            go.wait(60)
        return found

    monkeypatch.setattr(core_control, "outside_plan", check_then_wait)
    errors: list[BaseException] = []

    def run(fn: Callable[[], Any]) -> threading.Thread:
        def target() -> None:
            try:
                fn()
            except BaseException as exc:  # returned to the test
                errors.append(exc)
        thread = threading.Thread(target=target)
        thread.start()
        return thread

    asking = run(ask)
    assert checked.wait(30), "the request was never checked against the plan"

    def replan() -> None:
        core_control.restart(store, f"{job}#plan", slot, by="planner")
        with store.open(autocommit=True) as s:
            assert replace_plan(s, job, slot, Plan(2, (25,), 50))

    replanning = run(replan)
    replanning.join(5.0)  # without the hold the replan is done in well under this
    waited = replanning.is_alive()
    go.set()
    asking.join(60)
    replanning.join(60)
    return waited, errors
