"""A slot nobody runs offers no Pause: a holder killed with
SIGKILL while its lease still holds the slot is shown stalled ("its process is gone: nobody runs this
slot"), yet ``show`` (REST's slot detail, the Checkpoint tab) offered Pause, its note promising "The run
stops at its next chunk boundary and waits" for a run that does not exist. A real process, killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.module_cli import run_module_cli
from support.paths import TESTS
from support.stores import empty_store, spec_of

_HOLDER = """
import os, socket, sys, time
sys.path.insert(0, sys.argv[3])
from airflow_resumable.core import Attempt, Options
from airflow_resumable.core.model.identity import Identity
from support.stores import store_of

def work(ctx):
    ctx.total = 1000
    ctx.checkpoint(10, processed=10)
    print("holding", flush=True)
    time.sleep(600)

owner = f"ti-1/try1@{socket.gethostname()}:{os.getpid()}"
Attempt(store_of(sys.argv[1]), Identity(job=sys.argv[2], slot="s", attempt=1, owner=owner),
        options=Options(lease=120.0)).run(work)
"""


def _show(capsys: pytest.CaptureFixture[str], job: str) -> dict[str, Any]:
    assert run_module_cli(["show", job, "s", "--output", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_slot_whose_holder_was_killed_offers_no_pause_while_its_lease_holds(
        store_kind: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    store, uri = empty_store(store_kind, tmp_path, request)
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", uri)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, spec_of(store), "j.dead", str(TESTS)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        assert _show(capsys, "j.dead")["offers"]["pause"] is True  # alive: pause is offered
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)
    view = _show(capsys, "j.dead")
    assert (view["lease"], view["shown_status"]) == ("live", "stalled") and "is gone" in view["shown_why"], view
    assert view["offers"]["pause"] is False, (view["offers"], view.get("offer_notes", {}).get("pause"))
    if "offer_notes" in view:
        assert "is gone" in view["offer_notes"]["pause"], view["offer_notes"]["pause"]
