"""A slot's row written by hand into each state of the control requests' rules table
(core/model/request_rules.py): every status, pending request and lease. The rules' own tests
(tests/unit/core/model/test_request_rules.py) and the screens' (tests/integration/browser/) set it so.
"""

from __future__ import annotations

from typing import Any

from airflow_resumable.core import Store
from airflow_resumable.core.model.fence import Fence
from airflow_resumable.core.model.request_rules import Lease, Slot
from airflow_resumable.core.model.states import Request

JOB, SLOT = "rules.export", "2026-02-01T00:00:00+00:00"
#: No pending request, and each one.
REQUESTS: list[Request | None] = [None, *Request]
#: A lease's length, and how long ago its holder last heartbeat, for each lease (well inside each range).
LENGTH, AGE = 3600.0, {Lease.LIVE: 0.0, Lease.STALE: 3000.0, Lease.EXPIRED: 4000.0}


def seed(store: Store) -> None:
    """The slot's row, with no holder."""
    with store.open() as s:
        s.ensure_schema()
        got = s.leases.acquire(JOB, SLOT, "seed", 60)
        if got is not None:  # else another owner holds it, and a release by "seed" would match nothing
            s.leases.release(Fence.of(got[0]))


def set_row(store: Store, slot: Slot, cancel_request: str | None, *, length: float = LENGTH,
            age: float | None = None) -> Any:
    """Write ``slot``'s facts on the row by hand (a holder ``age`` seconds past its last heartbeat
    of a ``length``-second lease); returns the row."""
    with store.open() as s:
        if slot.lease is Lease.NONE:
            lease, params = "lease_owner = NULL, lease_expires_at = NULL", ()
        else:
            age = AGE[slot.lease] if age is None else age
            lease = (f"lease_owner = 'holder', heartbeat_at = {s.d.now_plus('%s')}, "
                     f"lease_expires_at = {s.d.now_plus('%s')}")
            params = (-age, length - age)
        s.execute(
            f"UPDATE resumable_checkpoints SET status = %s, request = %s, cancel_request = %s, stop_reason = NULL, "
            f"last_error = NULL, {lease} WHERE job = %s AND slot = %s",
            (slot.status.value, None if slot.request is None else slot.request.value, cancel_request, *params, JOB, SLOT),
        )
        s.commit()
        return s.checkpoints.load(JOB, SLOT)
