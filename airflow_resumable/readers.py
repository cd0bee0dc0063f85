"""Readers over Airflow connections and object storage, for ``ChunkedOperator(read=...)`` and handlers.

The readers themselves live in the core (:mod:`airflow_resumable.core.readers`, no Airflow); this
module connects them to Airflow: a SQL keyset reader through an Airflow connection (any type
whose hook is a DB-API hook: ``postgres``, ``sqlite``, ``mysql``...), a file reader through
Airflow's ``ObjectStoragePath`` (local files, S3, GCS... as the deployment configures). Nothing
is looked up when the DAG is parsed: the connection and the path are opened on the first read.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from typing import Any, BinaryIO

from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.readers import Batch, FileReader, KeysetReader, Reader, SequenceReader, json_key
from airflow_resumable.version_compat import AirflowNotFoundException, BaseHook

__all__ = [
    "Batch", "FileReader", "KeysetReader", "Reader", "SequenceReader", "connect", "json_key", "object_reader",
    "sql_reader",
]


def connect(conn_id: str) -> Any:
    """A DB-API connection for the Airflow connection ``conn_id``, through its hook.

    A ``sqlite`` connection opens the file with :mod:`sqlite3` (Airflow's SQLite provider is not
    needed); any other type asks its provider's hook (``get_hook().get_conn()``).

    Raises:
        ConfigurationError: the connection does not exist, or its type has no DB-API hook.
    """
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise ConfigurationError(
            f"the Airflow connection {conn_id!r} a reader reads from does not exist",
            hint=f"Create it, e.g. AIRFLOW_CONN_{conn_id.upper()}='postgresql://user:password@host:5432/dbname' "
            f"(or `airflow connections add {conn_id} --conn-uri ...`)",
        ) from None
    if (conn.conn_type or "").lower() == "sqlite":
        path = conn.host or conn.schema
        if not path or not os.path.isabs(path):
            raise ConfigurationError(
                f"the SQLite connection {conn_id!r} names no absolute database file ({path!r})",
                hint="Use sqlite:////absolute/path/source.db (four slashes)",
            )
        return sqlite3.connect(path)
    try:
        hook = conn.get_hook()
        return hook.get_conn()
    except AttributeError as exc:
        raise ConfigurationError(
            f"the connection {conn_id!r} (type {conn.conn_type!r}) has no DB-API hook a reader can use ({exc})",
            hint="Install the Airflow provider of that database, or use a postgres or sqlite connection",
        ) from exc


class _Connect:
    """``connect(conn_id)`` as a picklable, printable callable (operators are copied and serialized)."""

    def __init__(self, conn_id: str):
        self.conn_id = conn_id

    def __call__(self) -> Any:
        return connect(self.conn_id)

    def __repr__(self) -> str:
        return f"connect({self.conn_id!r})"


def sql_reader(conn_id: str, *, key: str | Sequence[str], **options: Any) -> KeysetReader:
    """Rows of a table (or a query) through the Airflow connection ``conn_id``, paged on ``key``.

    ``options`` are :class:`~airflow_resumable.core.readers.KeysetReader`'s: ``table=`` or
    ``query=``, ``columns=``, ``where=``, ``params=``, ``as_dict=``. The key must be unique (add
    ``id`` to a timestamp: ``key=("updated_at", "id")``) and should be indexed; ``where``/``query``
    use the driver's placeholders (``%s`` for PostgreSQL, ``?`` for SQLite) with ``params``.

    Raises:
        ConfigurationError: bad arguments, all named at once (when the DAG is parsed).
    """
    where = options.get("table") or "query"
    return KeysetReader(connect=_Connect(conn_id), key=key, name=f"{where} (connection {conn_id!r})", **options)


class _OpenPath:
    """Opens ``path`` (a URL or an ``ObjectStoragePath``) for binary reading, on first use."""

    def __init__(self, path: Any, conn_id: str | None):
        self.path, self.conn_id = path, conn_id

    def __call__(self) -> BinaryIO:
        from airflow_resumable.version_compat import ObjectStoragePath

        path = self.path if isinstance(self.path, ObjectStoragePath) else ObjectStoragePath(
            str(self.path), conn_id=self.conn_id)
        try:
            return path.open("rb")
        except FileNotFoundError:
            raise ConfigurationError(f"the file {_shown(str(self.path))!r} does not exist",
                                     hint="Check the path (and conn_id for an object store)") from None


def object_reader(
    path: Any,
    *,
    conn_id: str | None = None,
    format: str = "lines",
    encoding: str = "utf-8",
    header: bool = True,
    csv_options: dict[str, Any] | None = None,
    complete: bool | None = None,
    if_changed: str = "refuse",
) -> FileReader:
    """Records of the file at ``path`` through Airflow's ``ObjectStoragePath``, by byte offset.

    ``path`` is a URL (``file:///data/x.csv``, ``s3://bucket/key.jsonl``...) or an
    ``ObjectStoragePath``; ``conn_id`` names the Airflow connection with the object store's
    credentials. See :class:`~airflow_resumable.core.readers.FileReader` for the formats,
    ``complete`` (whether a last line without a line break is a record yet) and ``if_changed``
    (what a resume does when the object was rewritten or replaced since its position was read); a
    resume reads the 4 KiB before the saved offset (one ranged read on an object store, which checks
    them against the position's fingerprint) and goes on from there instead of reading the start again.

    Raises:
        ConfigurationError: bad arguments, all named at once (when the DAG is parsed).
    """
    return FileReader(open=_OpenPath(path, conn_id), format=format, encoding=encoding, header=header,
                      csv_options=csv_options, complete=complete, name=_shown(str(path)), if_changed=if_changed)


def _shown(url: str) -> str:
    """``url`` as errors and logs name it: credentials written into it (``s3://key:secret@bucket/x``)
    replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    where, slash, tail = rest.partition("/")
    if sep and "@" in where:
        return f"{scheme}://***@{where.rpartition('@')[2]}{slash}{tail}"
    return url
