"""The command line: schema administration for those who run DDL by hand or deny it to workers."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from airflow_resumable.core.errors import ResumableError
from airflow_resumable.core.migrations import SCHEMA_VERSION, current_version, migrate, plan
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store


def store_from_url(url: str) -> Store:
    """``sqlite:////absolute/path.db`` or a libpq URI (``postgresql://user@host:5432/db``)."""
    if url.startswith("sqlite:///"):
        return SQLiteStore(url[len("sqlite:///"):])
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore.from_dsn(url.replace("postgres://", "postgresql://", 1))
    raise SystemExit(f"unsupported URL {url.split(':', 1)[0]}:...; use sqlite:////abs/path.db or postgresql://...")


def _store(args: argparse.Namespace) -> Store:
    if args.url:
        return store_from_url(args.url)
    from airflow_resumable.hooks.resumable import ResumableHook  # needs Airflow

    return ResumableHook(args.conn_id).get_store()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_resumable", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("migrate", help=f"bring a checkpoint database to schema {SCHEMA_VERSION}")
    where = m.add_mutually_exclusive_group()
    where.add_argument("--conn-id", default="resumable_default", help="Airflow connection (default: %(default)s)")
    where.add_argument("--url", help="a database URL instead of an Airflow connection")
    what = m.add_mutually_exclusive_group()
    what.add_argument("--sql", action="store_true", help="print the SQL it would run, change nothing")
    what.add_argument("--check", action="store_true", help="exit 1 if the database needs migrating")
    args = parser.parse_args(argv)
    try:
        store = _store(args)
        with store.open() as session:
            if args.sql:
                for stmt in plan(session):
                    print(f"{stmt};")
                return 0
            if args.check:
                version = current_version(session) or 0
                print(f"{store.describe()}: schema {version}, this code needs {SCHEMA_VERSION}")
                return 0 if version == SCHEMA_VERSION else 1
            before = current_version(session) or 0
            after = migrate(session)
            print(f"{store.describe()}: schema {before} -> {after}" if after != before
                  else f"{store.describe()}: schema {after}, nothing to do")
            return 0
    except ResumableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
