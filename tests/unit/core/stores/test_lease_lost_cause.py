"""A lease lost is named by its cause: a person's forced Release of a live
holder is no takeover. The holder's next write is fenced (nothing of its chunk kept, nothing twice),
and its error must not tell of another attempt that took the lease over: none did."""

from __future__ import annotations

import threading
from typing import Any

from airflow_resumable.core import Attempt, LeaseLost, Options, Store
from airflow_resumable.core.control import requests as core_control
from airflow_resumable.core.model.identity import Identity


def test_a_forced_release_of_a_live_holder_is_named_as_such_not_as_a_takeover(store: Store) -> None:
    go, started = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def handler(ctx: Any) -> None:
        ctx.checkpoint(1, processed=1)
        started.set()
        go.wait(30)
        ctx.checkpoint(2, processed=2)

    def run() -> None:
        try:
            Attempt(store, Identity(job="j44", slot="s", attempt=1, owner="w1"), options=Options(lease=30)).run(handler)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(30)
    core_control.release(store, "j44", "s", by="bob", force=True)
    go.set()
    t.join(30)
    assert len(errors) == 1 and isinstance(errors[0], LeaseLost), errors
    text = str(errors[0])
    with store.open() as s:
        row = s.checkpoints.load("j44", "s")
    assert row.processed == 1  # fenced: the write after the release kept nothing
    assert "took it over" not in text and "taken over by another attempt" not in text, text
    assert "bob" in text and "lease_released" in text, text
