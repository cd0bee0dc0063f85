"""OpenLineage dataset names for what a resumable task reads and writes, by OpenLineage's naming
spec (``spec/Naming.md``): a namespace ``scheme://authority`` for the datasource, a name for the
dataset in it.

* A table or a query through an Airflow connection: the connection's own hook says its namespace
  and database (``get_openlineage_database_info``: PostgreSQL ``postgres://{host}:{port}``, name
  ``{database}.{schema}.{table}``, the schema being the connection's current one when the table
  names none); a query is parsed by OpenLineage's SQL parser into the tables it reads.
  A SQLite file, which the spec does not name: namespace ``sqlite://{path of the file}``, name the
  table. A connection whose hook says nothing: ``{conn_type}://{host}:{port}``.
* A file: ``s3://bucket`` and the key, ``gs://bucket`` and the object, ``file`` and the path (normalised:
  ``/data/in/../x.csv`` is ``/data/x.csv``).

Only the host and port of a connection are used, never its login, password or extras; a file's
URL loses its credentials and query before it gets here (:class:`~airflow_resumable.core.model.observe.Source`).
Whatever a connection's fields or a URL hold, no namespace or name carries a user, a password, a query
string or a fragment, and none is longer than :data:`~airflow_resumable.core.model.observe.NAME_LIMIT`
characters (1,000; cut with ``...``).
"""

from __future__ import annotations

import functools
import posixpath
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from airflow_resumable.core.model.observe import NAME_LIMIT, Source, cut_text, without_credentials

__all__ = ["Datasource", "dataset_names", "datasource"]

#: The longest query whose tables are parsed: OpenLineage's SQL parser recurses on a long chain of
#: ``OR``/``AND`` terms and overflows a thread's stack (a segfault that ends the task's process: 15,000
#: terms, 195 kB, on an 8 MB stack); a longer query is left out of the events, with a warning.
QUERY_LIMIT = 100_000
#: The parser runs in a thread of its own with this stack (virtual memory; 1.4 MB of such a chain
#: needed under 128 MB): a query within QUERY_LIMIT never reaches its end.
PARSE_STACK = 128 * 1024 * 1024
#: How long parsing a query, or asking a database for its current schema, may take before the name is
#: given up (the task goes on; a database that does not answer would otherwise hold the task's start).
LOOKUP_TIMEOUT = 15.0

_STACK_SIZE_LOCK = threading.Lock()
_PLACEHOLDERS = re.compile(r"%\([A-Za-z_][A-Za-z0-9_]*\)s|%s|\?")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+")  # two characters at least: C:/data is a path


@dataclass(frozen=True)
class Datasource:
    """Where an Airflow connection's tables live, as OpenLineage names it."""

    namespace: str
    database: str | None
    default_schema: str | None
    dialect: str | None


def _authority(value: Any) -> str:
    """A host (and port) as a namespace's authority: never a user, a password, a query, a fragment or a
    path someone put in a connection's host field (``alice:pw@db:5432/x?token=...`` -> ``db:5432``),
    percent-encoded ones included."""
    text = unquote(str(value or "")).strip()
    text = text.split("#", 1)[0].split("?", 1)[0]
    if "://" in text:
        text = text.split("://", 1)[1]
    text = text.rpartition("@")[2]
    if text.startswith("["):  # an IPv6 address: [::1]:5432
        address, bracket, port = text.partition("]")
        return f"{address}{bracket}{port.split('/', 1)[0].split(';', 1)[0]}".lower()
    return text.split("/", 1)[0].split(";", 1)[0].lower()


def _namespace(namespace: str) -> str:
    """``scheme://authority`` with its authority made safe (see :func:`_authority`), however it was built."""
    scheme, sep, rest = namespace.partition("://")
    if scheme == "sqlite":  # the spec names no SQLite: ours is the file's path
        return f"{scheme}{sep}{without_credentials(rest)}"
    return f"{scheme}{sep}{_authority(rest)}" if sep else _authority(namespace)


def _name(name: str) -> str:
    """A dataset name as it may leave the task: no query or fragment, at most :data:`NAME_LIMIT` characters."""
    return cut_text(name.split("#", 1)[0].split("?", 1)[0], NAME_LIMIT)


def _file_names(name: str) -> tuple[str, str]:
    """The namespace and name of a file's path or URL (its credentials, query and fragment dropped):
    ``s3://bucket`` and the key, ``file`` and the path."""
    text = without_credentials(name)
    scheme, sep, rest = text.partition("://")
    if sep and _SCHEME.fullmatch(scheme) and scheme.lower() != "file":
        host, _, path = rest.partition("/")
        return f"{scheme.lower()}://{_authority(host)}", path
    if text[:5].lower() == "file:":  # file:///data/x.csv, file:/data/x.csv
        text = text[5:]
        if text.startswith("//"):
            text = "/" + text[2:].partition("/")[2]
    # A local path names its file once: /data/in/../x.csv is /data/x.csv (an object store's key is kept as it
    # is: there ``..`` is part of the key).
    return "file", posixpath.normpath(text) if text else text


def _bounded(fn: Callable[[], Any], what: str, *, stack: int | None = None) -> Any:
    """``fn()``, run in a daemon thread (with a ``stack`` of its own) for at most :data:`LOOKUP_TIMEOUT` s.

    Raises:
        TimeoutError: it did not finish in time (it is left to finish on its own).
        Exception: what ``fn`` raised.
    """
    result: list[Any] = []

    def run() -> None:
        try:
            result.append((True, fn()))
        except BaseException as exc:
            result.append((False, exc))

    # The stack size is the process's, read when a thread starts: set, start, set back, under one lock (two
    # callers at once left it at PARSE_STACK for every later thread of the process). A thread another
    # library starts in that instant gets the large stack too (virtual memory, not used unless touched).
    with _STACK_SIZE_LOCK:
        try:
            previous = threading.stack_size(stack) if stack else None
        except (ValueError, RuntimeError):  # a platform that sets no stack size: the default one
            previous = None
        try:
            thread = threading.Thread(target=run, name=f"resumable-lineage-{what}", daemon=True)
            thread.start()
        finally:
            if previous is not None:
                threading.stack_size(previous)
    thread.join(LOOKUP_TIMEOUT)
    if not result:
        raise TimeoutError(f"{what} took more than {LOOKUP_TIMEOUT:g} s")
    ok, value = result[0]
    if not ok:
        raise value
    return value


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
        path = without_credentials(str(conn.host or conn.schema or ""))
        return Datasource(f"sqlite://{path}", None, None, "sqlite")
    hook = conn.get_hook()
    info = getattr(hook, "get_openlineage_database_info", lambda _conn: None)(conn)
    if info is None:
        port = f":{conn.port}" if conn.port else ""
        return Datasource(f"{conn_type or 'unknown'}://{_authority(conn.host)}{port}", conn.schema or None, None, None)
    try:
        schema = _bounded(hook.get_openlineage_default_schema, "current-schema")
    except Exception:  # the name is still useful without it
        schema = None
    dialect = getattr(hook, "get_openlineage_database_dialect", lambda _conn: None)(conn)
    return Datasource(_namespace(SQLParser.create_namespace(info)), info.database, schema, dialect)


def _table_name(source: Datasource, table: str) -> str:
    parts = [p for p in table.split(".") if p]
    if len(parts) == 1:
        parts = [source.default_schema, *parts] if source.default_schema else parts
    if len(parts) == 2 and source.database:
        parts = [source.database, *parts]
    return ".".join(str(p) for p in parts)


def dataset_names(src: Source) -> list[tuple[str, str]]:
    """``(namespace, name)`` of each dataset ``src`` stands for: one for a table or a file, the
    tables a query reads for a query, none for a table or query without a connection. No namespace
    or name holds a URL's credentials, query or fragment; a name is at most :data:`NAME_LIMIT`
    characters (cut with ``...``).

    Raises:
        Exception: looking up the connection, or parsing the query, failed; or nothing is left to name
            (a URL that was all credentials and query).
    """
    if src.kind == "file":
        namespace, name = _file_names(src.name)
        found = [(namespace, name)]
    elif src.connection is None:
        return []
    elif src.kind == "table":
        where = datasource(src.connection)
        found = [(where.namespace, _table_name(where, src.name))]
    else:
        from airflow_resumable.version_compat import SQLParser

        where = datasource(src.connection)
        # The parser reads SQL, not a driver's placeholders (%s, %(name)s, ?): a NULL stands in for each.
        if len(src.name) > QUERY_LIMIT:
            raise ValueError(f"the query is {len(src.name):,} characters long; OpenLineage's SQL parser is given "
                             f"{QUERY_LIMIT:,} at most. Name its tables with ctx.input(table=..., connection=...)")
        sql = _PLACEHOLDERS.sub("NULL", src.name)
        parser = SQLParser(dialect=where.dialect, default_schema=where.default_schema)
        parsed = _bounded(lambda: parser.parse(sql), "sql-parse", stack=PARSE_STACK)
        tables = [] if parsed is None else parsed.in_tables
        found = [(where.namespace, _table_name(where, t.qualified_name)) for t in tables]
    out = [(cut_text(_namespace(namespace), NAME_LIMIT), _name(name)) for namespace, name in found]
    if any(not name for _, name in out):
        raise ValueError(f"the {src.kind} names no dataset once its credentials, query and fragment are dropped")
    if any("\x00" in namespace or "\x00" in name for namespace, name in out):  # no path or table holds one
        raise ValueError(f"the {src.kind}'s name holds a NUL character, which a backend storing events in "
                         "PostgreSQL (Marquez) refuses with the whole event")
    return out
