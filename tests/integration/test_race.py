"""Two attempts of one slot at once, in two processes: two DAGs that share ``job=`` on the same
schedule, each run by its own ``airflow dags test`` (its own metadata database, as two deployments
on one checkpoint database would be).

The first holds the slot while the second waits for its lease; when the first finishes, the second
finds the slot done and must not run the handler again. Both processes start together (a cold
``airflow dags test`` takes most of the test's time); the second waits for a file before its task
reaches the slot, so the order of the two attempts is the test's, not the machine's.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

from airflow_resumable.core.stores import Store
from support.standalone import wait_for

DATE = "2026-03-01"
SLOT = "2026-03-01T00:00:00+00:00"


def dags_test(home: Path, dag_id: str, conf: dict, out: Path, store_uri: str) -> subprocess.Popen:
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
           "AIRFLOW_CONN_RESUMABLE_DEFAULT": store_uri}
    cmd = [sys.executable, "-m", "airflow", "dags", "test", "-c", json.dumps(conf), dag_id, DATE]
    return subprocess.Popen(cmd, env=env, stdout=out.open("w"), stderr=subprocess.STDOUT)


def home_copy(airflow_home: Path, target: Path) -> Path:
    """A second Airflow home with its own copy of the migrated metadata database."""
    target.mkdir()
    # Through SQLite's own backup, never a file copy: the metadata database is open in this process
    # (WAL mode), and closing a descriptor of our own on its file would drop SQLite's POSIX locks on
    # it (another process may then checkpoint and remove the WAL under this process's connection:
    # "database disk image is malformed" tests later). A file copy also misses what is in the WAL.
    with closing(sqlite3.connect(airflow_home / "airflow.db")) as live, closing(sqlite3.connect(target / "airflow.db")) as copy:
        live.backup(copy)
    (target / "dags").symlink_to(airflow_home / "dags")
    return target


def test_the_second_of_two_simultaneous_attempts_finds_the_slot_done_and_does_not_redo_it(
    airflow_home: Path, checkpoints: Store, store_uri: str, tmp_path: Path
) -> None:
    gate, turn = tmp_path / "gate", tmp_path / "turn"
    conf = {"gate": str(gate)}
    out_a, out_b = tmp_path / "a.log", tmp_path / "b.log"
    # Given two processes started together, the second held back before its task reaches the slot
    a = dags_test(home_copy(airflow_home, tmp_path / "home_a"), "rt_race_a", conf, out_a, store_uri)
    b = dags_test(home_copy(airflow_home, tmp_path / "home_b"), "rt_race_b", {**conf, "turn": str(turn)}, out_b,
                  store_uri)
    try:
        def held() -> bool:
            with checkpoints.open() as s:
                try:
                    row = s.checkpoints.load("race", SLOT)
                except Exception:  # the tables may not exist yet
                    s.rollback()
                    return False
            return bool(row and row.status == "running" and row.lease_owner)

        # and the first process holding the slot (its handler waits at the gate)
        # (a cold `airflow dags test` on a loaded machine: its task alone took 46 s to start beside CI)
        wait_for(held, timeout=300, interval=0.2, what="the first DAG to hold the slot",
                 on_timeout=lambda: out_a.read_text()[-3000:])
        # When the second process reaches the same slot and waits for its lease
        turn.touch()
        wait_for(lambda: "slot is held by" in out_b.read_text(), timeout=300, interval=0.2,
                 what="the second DAG to wait for the lease", on_timeout=lambda: out_b.read_text()[-3000:])
        gate.touch()  # and the first one finishes
        assert a.wait(timeout=120) == 0, out_a.read_text()[-3000:]
        assert b.wait(timeout=120) == 0, out_b.read_text()[-3000:]
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.kill()
    # Then every item was written once, by the first DAG only, and the second says why it did nothing
    with checkpoints.open() as s:
        rows = s.execute("SELECT item, dag_id FROM race_sink ORDER BY item").fetchall()
        history = [(h.dag_id, h.outcome) for h in s.listings.history("race", SLOT)]
        row = s.checkpoints.load("race", SLOT)
    assert [tuple(r) for r in rows] == [(i, "rt_race_a") for i in range(20)]
    assert history == [("rt_race_a", "done"), ("rt_race_b", "already_done")]
    assert (row.status, row.runs, row.dag_id, row.result) == ("done", 1, "rt_race_a", {"items": 20, "by": "rt_race_a"})
    log_b = out_b.read_text()
    assert "already finished" in log_b and "not running it again" in log_b
    for name, home in (("rt_race_a", "home_a"), ("rt_race_b", "home_b")):
        with sqlite3.connect(tmp_path / home / "airflow.db") as meta:
            states = meta.execute("SELECT state FROM task_instance WHERE dag_id = ?", (name,)).fetchall()
        assert states == [("success",)], (name, states)
