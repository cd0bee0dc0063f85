"""The command line: schema administration for those who run DDL by hand or deny it to workers,
and retention (``clean``: remove finished slots past a given age); with Airflow installed, also the
``airflow resumable`` group's other commands (``list``, ``show``, ``pause``...), the way to run them
on an Airflow without provider CLI commands (3.1)."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from airflow_resumable.core.model import defaults
from airflow_resumable.core.model.errors import ResumableError
from airflow_resumable.core.stores import PostgresStore, SQLiteStore, Store
from airflow_resumable.core.stores.migrations import SCHEMA_VERSION, current_version, migrate, plan


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

    # Connections from the metadata database too, as `airflow connections get` reads them.
    os.environ.setdefault("_AIRFLOW_PROCESS_CONTEXT", "server")
    return ResumableHook(args.conn_id).get_store()


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")

#: The numeric options' ranges (``python -m airflow_resumable`` and ``airflow resumable`` alike).
#: ``--older-than`` at most 100 years: further back than any checkpoint, and a cutoff the
#: databases' timestamps can still hold (99999999999999w overflowed them).
MAX_AGE_DAYS = 36500
#: ``--batch`` (slots per transaction of ``clean``) and ``--limit`` (slots ``list`` prints).
MAX_BATCH = MAX_LIMIT = 1_000_000


def duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``2w``, ``3600s`` or plain seconds, as seconds.

    Raises:
        argparse.ArgumentTypeError: anything else, not more than zero, or over 100 years
            (:data:`MAX_AGE_DAYS`); ``nan`` and ``inf`` are not durations.
    """
    match = _DURATION.match(text.lower())
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"] if match else math.nan
    if not 0 < seconds <= MAX_AGE_DAYS * 86400:  # False for nan; a very long number is inf
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration from 1s to {MAX_AGE_DAYS}d (100 years): write a number above 0 with a "
            "unit, e.g. 30d, 12h, 90m, 2w or 3600s")
    return seconds


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number from ``low`` to ``high``. Refused with the allowed
    range (argparse adds the option's name; exit status 2): anything else, ``nan``, ``inf``, 1.5."""

    def parse(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:  # not a whole number, or more digits than int() takes
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number from {low:,} to {high:,}")
        return value

    return parse


#: What ``python -m airflow_resumable --help`` says first (the module's docstring is reStructuredText
#: for the API docs; a terminal gets plain words).
DESCRIPTION = ("Schema administration for those who run DDL by hand or deny it to workers (migrate), and "
               "retention (clean: remove finished slots past a given age); with Airflow installed, also the "
               "'airflow resumable' group's other commands (list, show, pause...), the way to run them on an "
               "Airflow without provider CLI commands (3.1).")


def plain(text: str | None) -> str | None:
    """``text`` with its reStructuredText markup turned into plain words, for a terminal: literals
    (````x````) and roles (``:func:`x```) keep their text only."""
    if text is None:
        return None
    text = re.sub(r":\w+:`~?([^`<]+?)(?:\s*<[^>]*>)?`", r"\1", text)
    return re.sub(r"``([^`]+)``", r"\1", text)


def _where(command: argparse.ArgumentParser) -> None:
    where = command.add_mutually_exclusive_group()
    where.add_argument("--conn-id", default="resumable_default", help="Airflow connection (default: %(default)s)")
    where.add_argument("--url", help="a database URL instead of an Airflow connection")


def main(argv: Sequence[str] | None = None, *,
         more: Callable[[Any, argparse.ArgumentParser], set[str]] | None = None) -> int:
    """Run the command line; ``more`` adds commands of its own to the subparsers (their names)."""
    parser = argparse.ArgumentParser(prog="python -m airflow_resumable", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("migrate", help=f"bring a checkpoint database to schema {SCHEMA_VERSION}")
    _where(m)
    what = m.add_mutually_exclusive_group()
    what.add_argument("--sql", action="store_true", help="print the SQL it would run, change nothing")
    what.add_argument("--check", action="store_true", help="exit 1 if the database needs migrating")
    c = sub.add_parser(
        "clean", help="remove finished slots (done, failed, cancelled) and their history past an age",
        description="Remove the slots that finished (done, failed or cancelled) and were not written for "
        "--older-than, with their attempt history, in batches. Running slots and slots whose lease an attempt "
        "holds are never touched. A removed failed or cancelled slot starts over on its next attempt.",
    )
    _where(c)
    c.add_argument("--older-than", required=True, type=duration, metavar="DURATION",
                   help=f"age of the last write, e.g. 30d, 12h, 2w (at most {MAX_AGE_DAYS}d)")
    c.add_argument("--dry-run", action="store_true", help="count what would be removed, change nothing")
    c.add_argument("--batch", type=whole_number(1, MAX_BATCH), default=defaults.CLEAN_BATCH,
                   help=f"slots per transaction, 1 to {MAX_BATCH:,} (default: %(default)s)")
    steering = more(sub, parser) if more is not None else set()
    args = parser.parse_args(argv)
    if args.command in steering:
        args.func(args)  # exits 1, saying why, when the request is refused
        return 0
    try:
        store = _store(args)
        with store.open() as session:
            if args.command == "clean":
                session.ensure_schema(apply=False)
                cleaned = session.retention.clean(args.older_than, dry_run=args.dry_run, batch=args.batch)
                verb = "would remove" if args.dry_run else "removed"
                print(f"{store.describe()}: {verb} {cleaned.slots} finished slot(s) and {cleaned.records} history "
                      f"record(s) not written for {args.older_than:g}s")
                return 0
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
