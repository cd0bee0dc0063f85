"""The key codec: a key's values as an exact JSON position (what the keyset reader checkpoints)."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Sequence
from typing import Any

from airflow_resumable.core.model.checkpoint import short

__all__ = ["json_key", "json_keys"]


def json_key(value: Any) -> Any:
    """A key value as JSON: timestamps and dates as ISO-8601 text, decimals and UUIDs as text.

    The database converts the text back when it compares it with the column (PostgreSQL casts an
    untyped literal to the column's type; SQLite stores timestamps as text already), so the
    position is exact: ``isoformat()`` keeps the microseconds.

    Raises:
        TypeError: a value that has no exact JSON form (bytes, a float NaN).
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise TypeError(f"the key value {value!r} has no JSON form")
        return value
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    raise TypeError(f"the key value {short(value)} ({type(value).__name__}) has no exact JSON form")


def json_keys(values: Sequence[Any]) -> list[Any]:
    """A composite key as a JSON position: the list of its values' JSON forms.

    Raises:
        TypeError: a value that has no exact JSON form (see :func:`json_key`).
    """
    return [json_key(v) for v in values]
