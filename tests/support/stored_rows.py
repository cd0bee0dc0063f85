"""Rows of the checkpoint tables as the stores give them back (SQLite's shapes: timestamps as epoch
seconds, JSON as text), generated for property tests: rows the decoder reads, each column within
its range (numbers across the whole range, its edges drawn often), and rows with one judged column
out of it (tests/unit/core/stores/test_decoder.py, tests/unit/lineage/test_facets.py)."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import strategies as st

from airflow_resumable.core.model.columns import MAX_NUMBER, Column, Table

JOBS = ("export", "o'brien's export", "j[3]", "x" * 300)
SLOTS = ("2026-01-01T12:00:00+00:00", "manual__2026", "s" * 300)

#: JSON values: ints past 64 bits, floats, text, nested lists and objects.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8)


def whole_numbers(low: int, high: int) -> st.SearchStrategy[int]:
    """Whole numbers from ``low`` to ``high``; the edges, 2**31-1 and 2**53 (where a double stops
    counting one by one) drawn often."""
    edges = [v for v in (low, low + 1, 2**31 - 1, 2**53 - 1, 2**53, 2**53 + 1, high - 1, high) if low <= v <= high]
    return st.sampled_from(edges) | st.integers(low, high)


def good(col: Column) -> st.SearchStrategy[Any]:
    """A value ``col`` holds as this release writes it (None too where the column takes it)."""
    value: st.SearchStrategy[Any]
    if col.name == "job":
        value = st.sampled_from(JOBS)
    elif col.name == "slot":
        value = st.sampled_from(SLOTS)
    elif col.kind in MAX_NUMBER:
        value = whole_numbers(col.least, MAX_NUMBER[col.kind])
    elif col.kind == "float":
        value = st.sampled_from([0.0, 5e-324, 1.7976931348623157e308]) | st.floats(
            0, allow_nan=False, allow_infinity=False)
    elif col.kind == "timestamp":
        value = st.floats(0, 4e9)
    elif col.kind == "json" and col.name == "state":
        value = st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=3).map(json.dumps)
    elif col.kind == "json":
        value = JSON_VALUES.map(json.dumps)
    elif col.values is not None:
        value = st.sampled_from(col.values)
    else:
        value = st.text(max_size=20)
    return st.none() | value if col.nullable else value


def bad(col: Column) -> st.SearchStrategy[Any]:
    """A value of the right type that ``col`` never holds (a column the decoder judges)."""
    if col.kind in MAX_NUMBER:
        least, most = col.least, MAX_NUMBER[col.kind]
        return (st.integers(max_value=least - 1) | st.integers(min_value=most + 1)
                | st.sampled_from([least - 1, most + 1, -(2**63), -10]).filter(lambda v: not least <= v <= most))
    if col.kind == "float":
        return st.sampled_from([-1.0, -5e-324, math.inf, -math.inf, math.nan]) | st.floats(max_value=-1e-300)
    values = col.values
    assert values is not None, col
    return st.text(max_size=12).filter(lambda v: v not in values)


def rows(table: Table) -> st.SearchStrategy[tuple[Any, ...]]:
    """Rows of ``table`` the decoder reads: each column within its range."""
    return st.tuples(*(good(c) for c in table.columns))


@st.composite
def bad_rows(draw: st.DrawFn, table: Table) -> tuple[tuple[Any, ...], str]:
    """A row of ``table`` with one judged column out of its range, and that column's name."""
    row = list(draw(rows(table)))
    i, col = draw(st.sampled_from(table.judged))
    row[i] = draw(bad(col))
    return tuple(row), col.name
