"""The success confirmation: Airflow's success callback marks the slot's ``done`` row as confirmed.

Airflow runs success callbacks after it committed the task instance's success, so the mark means
"this task instance succeeded": a later Clear of it asks for the work again. Without the mark (a
failure or a kill after ``done``), a new try finishes without redoing it. The mark is written on the
attempt's own connection, handed over in a :class:`KeptSession` when the attempt ends well; the
callback connects again only without one.
"""

from __future__ import annotations

import threading
from typing import Any

from airflow_resumable.core.model.checkpoint import Origin, error_text
from airflow_resumable.core.model.outward import outward_text
from airflow_resumable.core.stores.base import StoreSession

__all__ = ["KeptSession", "confirm_on_success"]


class KeptSession:
    """The attempt's open connection, from its end to the success callback that confirms on it.

    Taken once, and only on the thread that gave it (a SQLite connection refuses another); a
    session nobody takes is closed when the holder is dropped (the driver closes it then).
    """

    def __init__(self) -> None:
        self._session: StoreSession | None = None
        self._thread: int | None = None

    def give(self, session: StoreSession | None) -> None:
        self._session, self._thread = session, threading.get_ident()

    def take(self) -> StoreSession | None:
        session, self._session = self._session, None
        if session is not None and self._thread != threading.get_ident():
            session.close()
            return None
        return session


def confirm_on_success(operator: Any, store: Any, job: str, slot: str, origin: Origin, *,
                       more: bool = False) -> KeptSession:
    """Add the confirming success callback to ``operator`` (replacing an earlier try's) and return
    the holder the attempt gives its connection to. ``more``: the slot is one more this execution
    runs after another (a partition's range taken by rebalancing, after its own): the callbacks
    confirming the others stay, so that each slot the task instance finished is confirmed."""
    log = operator.log
    kept = KeptSession()

    def confirm(context: Any) -> None:
        session = kept.take()
        try:
            if session is None:
                session = store.session(autocommit=True)
            session.checkpoints.confirm(job, slot, origin)
        except Exception as exc:  # a missing mark only means a later Clear finishes instead of redoing
            log.warning("could not record the success on the checkpoint row: %s [job=%s slot=%s]", error_text(exc, 300),
                        outward_text(job), outward_text(slot))
        finally:
            if session is not None:
                session.close()

    setattr(confirm, "resumable_confirm", True)  # noqa: B010 - a mark mypy cannot see on a function
    others = [cb for cb in operator.on_success_callback or () if more or not getattr(cb, "resumable_confirm", False)]
    operator.on_success_callback = [*others, confirm]
    return kept
