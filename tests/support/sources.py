"""Databases the reader tests read from: the checkpoint store's own database, through its driver."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from typing import Any


class Source:
    """A database to read from: the checkpoint store's own database, through its driver."""

    def __init__(self, kind: str, connect: Callable[[], Any]):
        self.kind, self.connect = kind, connect
        self.marker = "?" if kind == "sqlite" else "%s"

    def run(self, sql: str, rows: list[tuple[Any, ...]] | None = None) -> list[tuple[Any, ...]]:
        with closing(self.connect()) as conn:
            cur = conn.cursor()
            if rows is not None:
                cur.executemany(sql.replace("%s", self.marker), rows)
                out: list[tuple[Any, ...]] = []
            else:
                cur.execute(sql)
                out = cur.fetchall() if cur.description else []
            conn.commit()
            return out


def source_of(store_kind: str, path: str | None = None, pg_params: dict[str, Any] | None = None) -> Source:
    """The SQLite file at ``path``, or the PostgreSQL database of ``pg_params``."""
    if store_kind == "sqlite":
        assert path is not None
        return Source("sqlite", lambda: sqlite3.connect(path))
    import psycopg2

    params = dict(pg_params or {})
    return Source("postgres", lambda: psycopg2.connect(**params))
