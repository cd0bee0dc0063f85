"""``make standalone``, ``make standalone-stop`` and the checkpoint store ``make demo`` shares with them.

Three commands, each run with the project-local Airflow's environment already exported
(``eval "$(python -m devtools.airflow_env ...)"``):

``python -m devtools.standalone connection [--conn URI] [--with-export-source [--export-source URI]]``
    Records the checkpoint store in the Airflow home's own metadata database, as the connection
    ``resumable_default``: ``--conn`` when given (``RESUMABLE_CONN``), else the one recorded before,
    else the embedded SQLite file ``$AIRFLOW_HOME/checkpoints.db``. Every process that uses this
    Airflow home then reads the same store: the standalone's components, ``make demo`` and an
    ``airflow resumable ...`` command in another shell (``source .airflow-home/env.sh`` first).
    With ``--with-export-source`` (``make standalone``) it also records ``export_source``, the
    PostgreSQL database the customer export reads its customers from, when PostgreSQL is there: ``--export-source`` when given (``RESUMABLE_EXPORT_SOURCE``), else
    the one recorded before, else the checkpoint store when it is PostgreSQL, else the local server
    (``--export-source-probe``, default ``postgresql://postgres@127.0.0.1:5432/postgres``) if it
    answers. Prints both (no password) and writes ``env.sh``.

``python -m devtools.standalone run``
    Starts ``airflow standalone`` in a session of its own and stays in front of it. SIGINT
    (Ctrl-C), SIGTERM or SIGHUP to this process, or ``stop`` from any shell, stop all of it: SIGINT
    to ``airflow standalone`` (it stops its components), then SIGTERM and finally SIGKILL to every
    process of the session still there after a deadline (its scheduler has been seen ignoring SIGTERM
    for over a minute, and task processes run in process groups of their own, so a group kill alone
    leaves them). The pids are kept in ``$AIRFLOW_HOME/standalone.pid``.

``python -m devtools.standalone stop [--timeout S]``
    Stops the standalone of this Airflow home only (another checkout's is never touched) and waits
    until none of its processes is left.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

PID_FILE = "standalone.pid"
ENV_FILE = "env.sh"
CONN_ID = "resumable_default"
#: The customer export's source of customers (dags/customer_export.py): PostgreSQL only.
EXPORT_SOURCE_ID = "export_source"
#: Where ``connection`` looks for a PostgreSQL server for ``export_source`` when none is named.
LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
#: Seconds ``airflow standalone`` gets to stop its components after SIGINT, then each escalation.
STOP_TIMEOUT = float(os.environ.get("RESUMABLE_STOP_TIMEOUT", "30"))
ESCALATION = 10.0


def home() -> Path:
    return Path(os.environ["AIRFLOW_HOME"])


# -- the checkpoint store ---------------------------------------------------------------------------

def shown(uri: str) -> str:
    """``uri`` without its password, for printing."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def record_connection(requested: str | None) -> str:
    """The store's URI, recorded as ``resumable_default`` in this Airflow home's metadata database
    (migrated first when it is new)."""
    _migrate_if_new()
    return _record(CONN_ID, requested, f"sqlite:///{home() / 'checkpoints.db'}")  # type: ignore[return-value]


def record_export_source(requested: str | None, store_uri: str, probe: str = LOCAL_POSTGRES) -> str | None:
    """The customer export's ``export_source``, recorded in this Airflow home when PostgreSQL is
    there: ``requested``, else the one recorded before, else the checkpoint store when it is
    PostgreSQL, else ``probe`` if a server answers there (None: no PostgreSQL found, nothing recorded)."""
    if requested:
        return _record(EXPORT_SOURCE_ID, requested, None)
    if _recorded(EXPORT_SOURCE_ID) is not None:
        return _record(EXPORT_SOURCE_ID, None, None)
    if _is_postgres(store_uri):
        return _record(EXPORT_SOURCE_ID, store_uri, None)
    return _record(EXPORT_SOURCE_ID, probe, None) if _answers(probe) else None


def _is_postgres(uri: str) -> bool:
    return urlsplit(uri).scheme in ("postgres", "postgresql")


def _answers(uri: str) -> bool:
    """Whether a PostgreSQL server accepts a connection at ``uri`` (within 3 seconds)."""
    if not _is_postgres(uri):
        return False
    try:
        import psycopg2
    except ImportError:  # no driver: nothing to read customers with either
        return False
    try:
        psycopg2.connect(uri, connect_timeout=3).close()
    except psycopg2.Error:
        return False
    return True


def _recorded(conn_id: str) -> str | None:
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    with create_session() as session:
        found = session.query(Connection).filter(Connection.conn_id == conn_id).one_or_none()
        return None if found is None else _uri_of(found)


def _record(conn_id: str, requested: str | None, default: str | None) -> str | None:
    """Record ``conn_id`` in this home's metadata database: ``requested``, else the one recorded
    before, else ``default`` (None: leave it unrecorded). Returns its URI."""
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    with create_session() as session:
        found = session.query(Connection).filter(Connection.conn_id == conn_id).one_or_none()
        uri = requested or (_uri_of(found) if found is not None else default)
        if uri is None:
            return None
        if found is not None and _uri_of(found) != uri:
            session.delete(found)
            session.flush()
            found = None
        if found is None:
            session.add(Connection(conn_id=conn_id, uri=uri))
    return uri


def _uri_of(conn: Any) -> str:
    """The connection's URI as a person writes it (Airflow's ``get_uri()`` quotes a SQLite path)."""
    if (conn.conn_type or "").lower() == "sqlite" and not conn.password:
        return f"sqlite:///{conn.host or conn.schema}"
    return str(conn.get_uri())


def _migrate_if_new() -> None:
    from airflow.configuration import conf

    url = conf.get("database", "sql_alchemy_conn")
    if url.startswith("sqlite:///") and Path(url[len("sqlite:///"):]).exists():
        return
    print(f"setting up the Airflow metadata database in {home()} (first run only)...", flush=True)
    result = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"airflow db migrate failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def write_env_file() -> Path:
    """``$AIRFLOW_HOME/env.sh``: what another shell sources to be this project's Airflow (the
    ``airflow`` of the project's venv, its home and DAGs); the store is in the home's database."""
    keys = sorted(k for k in os.environ if k == "AIRFLOW_HOME" or (k.startswith("AIRFLOW__") and "SECRET" not in k))
    lines = ["# source this file to use the Airflow of `make standalone` (and its checkpoint store) from another shell"]
    lines.append(f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:\"$PATH\"")
    lines += [f"export {k}={shlex.quote(os.environ[k])}" for k in keys]
    lines.append("unset AIRFLOW_CONN_RESUMABLE_DEFAULT  # the store is the home's connection resumable_default")
    path = home() / ENV_FILE
    path.write_text("\n".join(lines) + "\n")
    return path


# -- processes ------------------------------------------------------------------------------------

def _read_pids(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int | None, created: float | None) -> Any:
    """The process ``pid`` if it is the one recorded (same start time: a reused pid is not it)."""
    import psutil

    if not pid:
        return None
    try:
        proc = psutil.Process(pid)
        if created is not None and abs(proc.create_time() - created) > 1.0:
            return None
        return proc if proc.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None


def session_members(sid: int, since: float) -> list[Any]:
    """Every live process of the session ``sid`` started after ``since``: the standalone's whole
    tree, task processes in their own process groups included, even orphaned ones."""
    import psutil

    found = []
    for proc in psutil.process_iter(["create_time"]):
        try:
            if os.getsid(proc.pid) == sid and proc.info["create_time"] >= since - 1.0 \
                    and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


def _signal_all(procs: Iterable[Any], sig: int) -> None:
    import psutil

    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def stop_session(sid: int, since: float, *, timeout: float = STOP_TIMEOUT) -> list[str]:
    """Stop the standalone whose session is ``sid``: SIGINT to its leader, then SIGTERM, then
    SIGKILL to what is left of the session after each deadline. Returns what it escalated to."""
    import psutil

    steps = []
    leader = _alive(sid, None)
    if leader is not None:
        _signal_all([leader], signal.SIGINT)
    for sig, wait in ((None, timeout), (signal.SIGTERM, ESCALATION), (signal.SIGKILL, ESCALATION)):
        members = session_members(sid, since)
        if not members:
            break
        if sig is not None:
            steps.append(f"{signal.Signals(sig).name} to {len(members)} process(es) still running")
            _signal_all(members, sig)
        deadline = time.monotonic() + wait
        while members and time.monotonic() < deadline:
            _gone, members = psutil.wait_procs(members, timeout=0.5)
            members += [p for p in session_members(sid, since) if p not in members]
    return steps


def port_taken(host: str, port: str) -> str | None:
    """Why the api-server could not listen on ``host``:``port`` (another server does), else None.

    Airflow's api-server would exit at once while ``airflow standalone`` kept its scheduler: every
    task would call the Execution API of that other server, and the UI link would open it."""
    import socket

    address = host.strip("[]")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no owner
        try:
            probe.bind((address, int(port)))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return (f"the api-server cannot listen on {host} port {port} ({exc.strerror}): set "
                        f"AIRFLOW__API__HOST to an address of this machine, or leave it unset (127.0.0.1)")
            return (f"port {port} on {host} is taken ({exc.strerror}): another server listens there (another "
                    f"`make standalone`?); stop it, or give this one another port: make standalone PORT=28080")
    return None


def run(argv: list[str]) -> int:
    """Start ``airflow standalone`` and stop all of it on SIGINT, SIGTERM or SIGHUP."""
    import psutil

    path = home() / PID_FILE
    pids = _read_pids(path)
    if pids and (_alive(pids.get("pid"), pids.get("created")) or _alive(pids.get("airflow_pid"), pids.get("airflow_created"))):
        print(f"a standalone already runs from {home()} (pid {pids['pid']}); stop it first: make standalone-stop",
              file=sys.stderr)
        return 1

    taken = port_taken(os.environ.get("AIRFLOW__API__HOST") or "127.0.0.1", os.environ.get("AIRFLOW__API__PORT") or "8080")
    if taken:
        print(taken, file=sys.stderr)
        return 1

    def child_setup() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background job inherits SIGINT ignored

    child = subprocess.Popen(argv, start_new_session=True, preexec_fn=child_setup)
    since = psutil.Process(child.pid).create_time()
    me = psutil.Process()
    path.write_text(json.dumps({"pid": me.pid, "created": me.create_time(), "airflow_pid": child.pid,
                                "airflow_created": since}))
    asked: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        asked.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    print(f"standalone: pid {me.pid}; stop it with Ctrl-C, `make standalone-stop` or `kill {me.pid}` "
          f"(pids in {path})", flush=True)
    try:
        while child.poll() is None and not asked:
            time.sleep(0.5)
        if asked:
            print(f"standalone: {signal.Signals(asked[0]).name}: stopping all of it...", flush=True)
        steps = stop_session(child.pid, since)
        for step in steps:
            print(f"standalone: {step}", flush=True)
        print("standalone: stopped", flush=True)
    finally:
        path.unlink(missing_ok=True)
    return 0 if asked else (child.returncode or 0)


def stop(timeout: float) -> int:
    """Stop this Airflow home's standalone, from any shell; wait until none of its processes is left."""
    path = home() / PID_FILE
    pids = _read_pids(path)
    if not pids:
        print(f"no standalone runs from {home()} (no {PID_FILE})")
        return 0
    front = _alive(pids.get("pid"), pids.get("created"))
    if front is not None:
        front.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout + 2 * ESCALATION + 10
        # Polled: the front process is not our child, and one that ended stays a zombie until its
        # parent (the shell that started it) reaps it.
        while _alive(pids.get("pid"), pids.get("created")) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pids.get("pid"), pids.get("created")) is not None:
            front.kill()
    # Whatever the front process left (it was killed, or it died before it finished):
    stop_session(pids["airflow_pid"], pids["airflow_created"], timeout=0)
    left = session_members(pids["airflow_pid"], pids["airflow_created"])
    path.unlink(missing_ok=True)
    if left:
        print(f"standalone: {len(left)} process(es) survived SIGKILL: {[p.pid for p in left]}", file=sys.stderr)
        return 1
    print(f"standalone of {home()} stopped")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("connection", help="record the checkpoint store in this Airflow home; print it")
    c.add_argument("--conn", default=None, help="the store's URI (RESUMABLE_CONN); default: the recorded one")
    c.add_argument("--env-file", action="store_true", help=f"also write $AIRFLOW_HOME/{ENV_FILE} for other shells")
    c.add_argument("--with-export-source", action="store_true",
                   help="also record the customer export's PostgreSQL source, export_source (make standalone)")
    c.add_argument("--export-source", default=None,
                   help=f"the customer export's PostgreSQL source (RESUMABLE_EXPORT_SOURCE); default: the recorded "
                   f"one, the store if it is PostgreSQL, else {LOCAL_POSTGRES} if it answers")
    c.add_argument("--export-source-probe", default=LOCAL_POSTGRES, help=argparse.SUPPRESS)
    sub.add_parser("run", help="start airflow standalone; SIGINT/SIGTERM/SIGHUP stop all of it")
    s = sub.add_parser("stop", help="stop this Airflow home's standalone")
    s.add_argument("--timeout", type=float, default=STOP_TIMEOUT)
    args = parser.parse_args()
    if args.command == "connection":
        uri = record_connection(args.conn or None)
        if args.env_file:
            write_env_file()
        print(f"checkpoints: {shown(uri)}  (connection {CONN_ID} of {home()}; set RESUMABLE_CONN to change)")
        if not args.with_export_source:
            return
        source = record_export_source(args.export_source or None, uri, args.export_source_probe)
        if source is None:
            print(f"customer_export: no PostgreSQL found at {shown(args.export_source_probe)}; it needs one for its "
                  f"customers: set RESUMABLE_EXPORT_SOURCE=postgresql://user:password@host:5432/dbname (the "
                  f"connection {EXPORT_SOURCE_ID}). Every other example DAG runs on the embedded store.")
        else:
            print(f"customer_export reads its customers from: {shown(source)}  (connection {EXPORT_SOURCE_ID}; set "
                  "RESUMABLE_EXPORT_SOURCE to change)")
        return
    if args.command == "run":
        raise SystemExit(run([str(Path(sys.executable).parent / "airflow"), "standalone"]))
    raise SystemExit(stop(args.timeout))


if __name__ == "__main__":
    main()
