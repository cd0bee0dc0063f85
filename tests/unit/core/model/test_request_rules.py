"""The control requests' rules (core/model/request_rules.py) agree with themselves: for every status, pending
request and lease, the store's SQL (the conditional writes, the offers) does what the table's
Python answer says, and a refused request gives the reason the table gives. On both stores.

Rows are set to each state by hand (support/rule_rows.py), then every request goes through the control API.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_resumable.core import RequestRefused, Store, control, rules
from airflow_resumable.core.model.request_rules import Action, Lease, Pending, Rule, Slot
from airflow_resumable.core.model.states import FINISHED, Request, Status
from support.rule_rows import AGE, JOB, LENGTH, REQUESTS, SLOT, seed, set_row

#: Every request the faces can send: the five, and release with force.
ASKS = [*((a, False) for a in Action), (Action.RELEASE, True)]


def ask(store: Store, action: Action, force: bool) -> Any:
    extra = {"force": force} if action is Action.RELEASE else {}
    return getattr(control, action.value)(store, JOB, SLOT, by="prop", **extra)


def check(store: Store, slot: Slot, cancel_request: str | None, action: Action, force: bool, **lease: float) -> None:
    """Given the row set to ``slot``, the store's offers and its answer to ``action`` are the table's."""
    before = set_row(store, slot, cancel_request, **lease)
    assert rules.slot_of(before, datetime.now(tz=timezone.utc)) == slot, "the row is not the slot meant"
    with store.open() as s:
        assert s.requests.offers(JOB, SLOT) == rules.offers(slot), f"offers of {slot}"
    expected = rules.decide(action, slot, force=force)
    what = f"{action} (force={force}) of {slot}"
    if isinstance(expected, Rule):
        after, then = ask(store, action, force), expected.then
        assert after.status == (then.status or before.status), what
        assert after.request == (before.request if then.request is rules.KEEP else then.request), what
        pending = {Pending.KEEP: before.cancel_request, Pending.CLEAR: None, Pending.REASON: "requested"}
        assert after.cancel_request == pending[then.cancel_request], what
        if then.fence:
            assert (after.lease_owner, after.lease_token) == (None, before.lease_token + 1), what
        else:
            assert (after.lease_owner, after.lease_token) == (before.lease_owner, before.lease_token), what
        if then.stop:
            assert (after.stop_reason, after.last_error) == ("requested", "cancelled by prop"), what
        assert after.requested_by == "prop", what
    else:
        with pytest.raises(RequestRefused) as refused:
            ask(store, action, force)
        assert (refused.value.message, refused.value.hint) == rules.refusal_text(expected, action, before), what
        with store.open() as s:
            assert s.checkpoints.load(JOB, SLOT) == before, f"{what} was refused but changed the row"


def test_every_request_in_every_state_does_in_sql_what_the_table_says(store: Store) -> None:
    seed(store)
    for status, request, lease, (action, force) in itertools.product(Status, REQUESTS, Lease, ASKS):
        check(store, Slot(status, request, lease), "superseded" if status is Status.RUNNING else None, action, force)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=st.sampled_from(list(Status)), request=st.sampled_from(REQUESTS),
       cancel_request=st.sampled_from([None, "requested", "superseded"]), ask_=st.sampled_from(ASKS),
       lease=st.sampled_from(list(Lease)), length=st.floats(60, 86400), place=st.floats(0.05, 0.95))
def test_sql_and_python_agree_anywhere_inside_each_lease_state(
    store: Store, status: Status, request: Request | None, cancel_request: str | None, ask_: tuple[Action, bool],
    lease: Lease, length: float, place: float,
) -> None:
    # A holder's last heartbeat anywhere inside its lease state's range (10 s clear of its edges)
    low, high = {Lease.NONE: (0, 0), Lease.LIVE: (0, length * 2 / 3 - 10), Lease.STALE: (length * 2 / 3 + 10, length - 10),
                 Lease.EXPIRED: (length + 10, 10 * length)}[lease]
    seed(store)
    check(store, Slot(status, request, lease), cancel_request, *ask_, length=length, age=low + (high - low) * place)


def test_the_table_covers_every_request_in_every_state_and_its_faces_list_them() -> None:
    for status, request, lease, (action, force) in itertools.product(Status, REQUESTS, Lease, ASKS):
        slot = Slot(status, request, lease)
        taken = [r for r in rules.rules_of(action, force=force) if r.when(slot)]
        assert len(taken) <= 1, f"two rules take {action} of {slot}: {taken}"
        assert isinstance(rules.decide(action, slot, force=force), (Rule, rules.Refusal))
    assert rules.ACTIONS == ("pause", "resume", "cancel", "restart", "release") == tuple(control.ACTIONS)
    assert FINISHED == {Status.DONE, Status.FAILED, Status.CANCELLED}
    assert rules.taken_when(Action.RELEASE).endswith("(with --force)")


def test_every_request_in_every_state_says_what_it_would_do_now_or_why_not() -> None:
    """The UI's tooltips: for every status, pending request and lease, each request's sentence is
    the rule that takes it (its own words, every placeholder filled) or the refusal's reason."""
    from datetime import timedelta

    from airflow_resumable.core.model.checkpoint import Checkpoint

    now = datetime(2026, 2, 1, 12, tzinfo=timezone.utc)
    assert all(r.does for r in rules.RULES), [r for r in rules.RULES if not r.does]
    for status, request, lease, action in itertools.product(Status, REQUESTS, Lease, Action):
        ago = AGE.get(lease, 0.0)
        row = Checkpoint(
            job=JOB, slot=SLOT, status=status.value, request=None if request is None else request.value,
            requested_by="<b>alice</b>", lease_owner=None if lease is Lease.NONE else "ti/try1@host-1:42",
            heartbeat_at=None if lease is Lease.NONE else now - timedelta(seconds=ago),
            lease_expires_at=None if lease is Lease.NONE else now + timedelta(seconds=LENGTH - ago))
        assert rules.slot_of(row, now) == Slot(status, request, lease)
        found = rules.decide(action, Slot(status, request, lease))
        text = rules.explain(action, row, now)
        assert "{" not in text and "}" not in text, text
        gone = (f"its lease was released (last holder try {row.attempt})" if lease is Lease.NONE
                else f"its lease expired at {row.lease_expires_at.isoformat()} (last holder ti/try1@host-1:42)")
        if isinstance(found, Rule):
            assert text == found.does.format(by="<b>alice</b>", holder="host-1:42", status=status.value,
                                             gone=gone), text
        else:
            assert text.startswith("Not now: ") and rules.refusal_text(found, action, row)[0] in text, text
        # The database's answer decides: a sentence never contradicts the button
        other = rules.explain(action, row, now, taken=not isinstance(found, Rule))
        assert "changing" in other, other
        # No tooltip is the last resort's, which only a slot that changed under the write gets
        assert found is not rules.OTHERWISE, (action, status, request, lease)
    # ... and that one says exactly what to do: the same request again, which the slot now takes
    row = Checkpoint(job=JOB, slot=SLOT, status="running", lease_owner=None)
    message, hint = rules.refusal_text(rules.OTHERWISE, Action.RESTART, row)
    assert message == ("the slot changed while the restart was written (it is running now: a lease lapsed or a "
                       "holder ended at that moment), so nothing was changed")
    assert hint == "Ask for the restart again (its button, or the same command): the slot as it is now takes it"
