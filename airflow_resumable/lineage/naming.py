"""OpenLineage dataset names for what a resumable task reads and writes, by OpenLineage's naming
spec (``spec/Naming.md``): a namespace ``scheme://authority`` for the datasource, a name for the
dataset in it.

* A table or a query through an Airflow connection: the connection's own hook says its namespace
  and database (``get_openlineage_database_info``: PostgreSQL ``postgres://{host}:{port}``, name
  ``{database}.{schema}.{table}``, the schema being the connection's current one when the table
  names none); a query is parsed by OpenLineage's SQL parser into the tables it reads.
  A SQLite file, which the spec does not name: namespace ``sqlite://{path of the file}``, name the
  table. A connection whose hook says nothing: ``{conn_type}://{host}:{port}``.
* A file: ``s3://bucket`` and the key, ``gs://bucket`` and the object, ``file`` and the path.

Only the host and port of a connection are used, never its login, password or extras; a file's
URL loses its credentials and query before it gets here (:class:`~airflow_resumable.core.observe.Source`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from airflow_resumable.core.observe import Source, cut_text, without_credentials

__all__ = ["Datasource", "dataset_names", "datasource"]

_PLACEHOLDERS = re.compile(r"%\([A-Za-z_][A-Za-z0-9_]*\)s|%s|\?")


@dataclass(frozen=True)
class Datasource:
    """Where an Airflow connection's tables live, as OpenLineage names it."""

    namespace: str
    database: str | None
    default_schema: str | None
    dialect: str | None


def _host(value: Any) -> str:
    """A host name, never with a user or password someone put in the host field."""
    return str(value or "").rsplit("@", 1)[-1]


@functools.lru_cache(maxsize=64)
def datasource(conn_id: str) -> Datasource:
    """The connection's datasource (cached per process: one look-up, and for PostgreSQL one
    ``SELECT CURRENT_SCHEMA``, per connection).

    Raises:
        Exception: whatever looking up the connection or asking its hook raises.
    """
    from airflow_resumable.version_compat import BaseHook, SQLParser

    conn = BaseHook.get_connection(conn_id)
    conn_type = (conn.conn_type or "").lower()
    if conn_type == "sqlite":
        path = conn.host or conn.schema or ""
        return Datasource(f"sqlite://{path}", None, None, "sqlite")
    hook = conn.get_hook()
    info = getattr(hook, "get_openlineage_database_info", lambda _conn: None)(conn)
    if info is None:
        port = f":{conn.port}" if conn.port else ""
        return Datasource(f"{conn_type or 'unknown'}://{_host(conn.host)}{port}", conn.schema or None, None, None)
    try:
        schema = hook.get_openlineage_default_schema()
    except Exception:  # the name is still useful without it
        schema = None
    dialect = getattr(hook, "get_openlineage_database_dialect", lambda _conn: None)(conn)
    return Datasource(SQLParser.create_namespace(info), info.database, schema, dialect)


def _table_name(source: Datasource, table: str) -> str:
    parts = [p for p in table.split(".") if p]
    if len(parts) == 1:
        parts = [source.default_schema, *parts] if source.default_schema else parts
    if len(parts) == 2 and source.database:
        parts = [source.database, *parts]
    return ".".join(str(p) for p in parts)


def dataset_names(src: Source) -> list[tuple[str, str]]:
    """``(namespace, name)`` of each dataset ``src`` stands for: one for a table or a file, the
    tables a query reads for a query, none for a table or query without a connection.

    Raises:
        Exception: looking up the connection, or parsing the query, failed.
    """
    if src.kind == "file":
        url = urlsplit(without_credentials(src.name))
        if url.scheme and url.scheme != "file":
            return [(f"{url.scheme}://{url.netloc}", url.path.lstrip("/"))]
        return [("file", url.path if url.scheme else src.name)]
    if src.connection is None:
        return []
    where = datasource(src.connection)
    if src.kind == "table":
        return [(where.namespace, cut_text(_table_name(where, src.name)))]
    from airflow_resumable.version_compat import SQLParser

    # The parser reads SQL, not a driver's placeholders (%s, %(name)s, ?): a NULL stands in for each.
    sql = _PLACEHOLDERS.sub("NULL", src.name)
    parsed = SQLParser(dialect=where.dialect, default_schema=where.default_schema).parse(sql)
    tables = [] if parsed is None else parsed.in_tables
    return [(where.namespace, cut_text(_table_name(where, t.qualified_name))) for t in tables]
