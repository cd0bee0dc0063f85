"""A PostgreSQL server for the tests: the machine's own on 127.0.0.1:5432, or a throwaway cluster.

A test gets a schema of its own (:meth:`Server.create_schema`) in one database the session shares:
creating a schema costs milliseconds where creating and dropping a database costs a third of a
second. Tests that need a whole database (an Airflow metadata database, a deployment's checkpoint
database, a test that counts the server's row versions) still get one (:meth:`Server.create_database`).

Order: ``RESUMABLE_TEST_PG_DSN`` if set; else the server on 127.0.0.1:5432 (user postgres, trust);
else, where PostgreSQL's binaries exist, a throwaway cluster started in a temporary folder on a
free port and stopped at the end. When none of these works the tests that need PostgreSQL *fail*
with the reason: they never skip.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from contextlib import closing
from typing import Any
from urllib.parse import quote

import psycopg2

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _can_connect(dsn: str) -> str | None:
    try:
        with closing(psycopg2.connect(dsn, connect_timeout=3)):
            return None
    except psycopg2.Error as exc:
        return str(exc).strip()


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Throwaway:
    """initdb + pg_ctl in a temporary folder (as the postgres user when running as root)."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="resumable-pg-")
        self.port = _free_port()
        self.data = os.path.join(self.dir, "data")
        self._as: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            self._as = ["runuser", "-u", "postgres", "--"]

    def start(self) -> str:
        initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if not initdb or not pg_ctl:
            raise RuntimeError("PostgreSQL's binaries (initdb, pg_ctl) are not installed")
        subprocess.run([*self._as, initdb, "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                       check=True, capture_output=True)
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run([*self._as, pg_ctl, "-D", self.data, "-o", opts, "-l", os.path.join(self.dir, "log"),
                        "-w", "-t", "60", "start"], check=True, capture_output=True)
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        pg_ctl = _pg_bin("pg_ctl")
        if pg_ctl:
            subprocess.run([*self._as, pg_ctl, "-D", self.data, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


class Server:
    """The server the session uses, and the databases it made there."""

    def __init__(self) -> None:
        self.throwaway: Throwaway | None = None
        self.admin_dsn = os.environ.get("RESUMABLE_TEST_PG_DSN", DEFAULT_DSN)
        self.databases: list[str] = []
        # The database every schema of the session lives in, made on the first create_schema(),
        # and the connection that creates the schemas (one connection, not one per test).
        self._schemas_db: str | None = None
        self._schemas_conn: Any = None

    def start(self) -> Server:
        problem = _can_connect(self.admin_dsn)
        if problem is None:
            return self
        if "RESUMABLE_TEST_PG_DSN" in os.environ:
            raise RuntimeError(f"RESUMABLE_TEST_PG_DSN does not answer: {problem}")
        try:
            self.throwaway = Throwaway()
            self.admin_dsn = self.throwaway.start()
        except Exception as exc:
            raise RuntimeError(
                f"no PostgreSQL for the tests: {DEFAULT_DSN} said {problem!r}, and a throwaway cluster "
                f"could not start ({exc}). Install PostgreSQL or set RESUMABLE_TEST_PG_DSN"
            ) from exc
        deadline = time.monotonic() + 30
        while (problem := _can_connect(self.admin_dsn)) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the throwaway PostgreSQL did not answer: {problem}")
            time.sleep(0.2)
        return self

    def create_database(self, prefix: str = "resumable_test") -> dict[str, object]:
        """A new empty database; returns libpq keyword parameters for it."""
        params = psycopg2.extensions.parse_dsn(self.admin_dsn)
        params["dbname"] = self._new_database(prefix)
        return params

    def create_schema(self, prefix: str = "resumable_test") -> dict[str, object]:
        """A new empty schema in the session's shared test database; returns libpq keyword
        parameters whose ``options`` make it the connection's only ``search_path`` entry, so every
        unqualified table (the checkpoint tables, a test's sink) is created and found there.

        Raises:
            psycopg2.Error: the server refused to create the database or the schema.
        """
        if self._schemas_conn is None:
            self._schemas_db = self._new_database(f"{prefix}_schemas")
            self._schemas_conn = psycopg2.connect(self.admin_dsn, dbname=self._schemas_db)
            self._schemas_conn.autocommit = True
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        self._schemas_conn.cursor().execute(f'CREATE SCHEMA "{name}"')
        params = psycopg2.extensions.parse_dsn(self.admin_dsn)
        params["dbname"] = self._schemas_db
        params["options"] = f"-c search_path={name}"
        return params

    def _new_database(self, prefix: str) -> str:
        """Creates a database named ``<prefix>_<random>`` (:meth:`stop` drops it); returns its name."""
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with closing(psycopg2.connect(self.admin_dsn)) as conn:
            conn.autocommit = True
            conn.cursor().execute(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return name

    def stop(self) -> None:
        """Drops the session's databases (the shared one with every schema in it, in one go)."""
        if self._schemas_conn is not None:
            self._schemas_conn.close()
            self._schemas_conn = None
        try:
            with closing(psycopg2.connect(self.admin_dsn)) as conn:
                conn.autocommit = True
                for name in self.databases:
                    conn.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except psycopg2.Error:
            pass
        if self.throwaway is not None:
            self.throwaway.stop()


def dsn(params: dict[str, object]) -> str:
    """A postgresql:// URI for libpq parameters (as Airflow connections take them); a schema's
    ``options`` (:meth:`Server.create_schema`) become the URI's ``options`` query parameter, which
    libpq reads and Airflow turns into the connection's ``options`` extra."""
    user = params.get("user", "postgres")
    password = f":{params['password']}" if params.get("password") else ""
    options = f"?options={quote(str(params['options']), safe='')}" if params.get("options") else ""
    return (f"postgresql://{user}{password}@{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}/"
            f"{params['dbname']}{options}")
