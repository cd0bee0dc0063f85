"""The fence of an attempt: the lease it holds on one slot, as one value.

Every write made on behalf of an attempt names its :class:`Fence` and matches no row once another
attempt has taken the lease over (``WHERE job, slot, lease_owner, lease_token``). It is made once,
when the lease is acquired (:meth:`Fence.of` the acquired row), and handed as one argument to the
session's fenced writes, the lease keeper and the checkpoint writer.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_resumable.core.model.checkpoint import Checkpoint

__all__ = ["Fence"]


@dataclasses.dataclass(frozen=True, slots=True)
class Fence:
    """The lease one attempt holds: whose it is (``owner``) and which taking of it (``token``,
    grown on every acquire by another owner or after expiry)."""

    job: str
    slot: str
    owner: str
    token: int

    @classmethod
    def of(cls, row: Checkpoint) -> Fence:
        """The fence of a row just acquired (its lease owner and token).

        Raises:
            ValueError: the row holds no lease (it was not returned by an acquire).
        """
        if row.lease_owner is None:
            raise ValueError(f"the row of job {row.job!r} slot {row.slot!r} holds no lease: it has no fence")
        return cls(row.job, row.slot, row.lease_owner, row.lease_token)

    def params(self) -> dict[str, object]:
        """The fence as the named parameters of a fenced write's ``WHERE`` (see :data:`WHERE`)."""
        return {"job": self.job, "slot": self.slot, "owner": self.owner, "token": self.token}


#: The condition of every fenced write, with the named parameters of :meth:`Fence.params`.
WHERE = "job = %(job)s AND slot = %(slot)s AND lease_owner = %(owner)s AND lease_token = %(token)s"
