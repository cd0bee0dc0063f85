"""``make standalone`` on a port another server already listens on (another checkout's standalone,
any web server): Airflow's api-server cannot bind and exits, but ``airflow standalone`` keeps its
scheduler running (its loop never looks at its components), so every task calls the Execution API
of whatever answers on that port (another Airflow: its tasks fail there) and the printed UI link
opens that other server. ``devtools.standalone run`` refuses before starting anything, naming the
port and what to do.

No Airflow here: the command started is ``true``.
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest

from devtools import standalone


def test_a_port_another_server_listens_on_is_refused_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    marker = tmp_path / "started"
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__API__HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__API__PORT", str(port))
    try:
        code = standalone.run(["touch", str(marker)])
    finally:
        taken.close()
    err = capsys.readouterr().err
    assert code != 0 and not marker.exists(), "airflow standalone was started on a port another server holds"
    assert f"port {port}" in err and "PORT=" in err, err


def test_a_free_port_starts_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    free = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    marker = tmp_path / "started"
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__API__HOST", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW__API__PORT", str(port))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        assert standalone.run(["touch", str(marker)]) == 0
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert marker.exists()


def test_an_address_this_machine_does_not_have_is_named_as_such(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__API__HOST", "192.0.2.1")  # TEST-NET-1: no machine's own address
    monkeypatch.setenv("AIRFLOW__API__PORT", "28080")
    assert standalone.run(["true"]) == 1
    err = capsys.readouterr().err
    assert "cannot listen on 192.0.2.1" in err and "taken" not in err, err
