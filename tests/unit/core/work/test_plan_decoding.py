"""A partitioned job's plan is read whole or refused (``Plan.from_state``, the one decoder of a plan
row's state): sealed, the seal matching, its boundaries in the key's order. A refused plan is a
``CorruptPlan``: a ``CorruptCheckpoint`` of the plan row (and a ``ConfigurationError``, as every
refused plan was), naming the plan row and the restart that splits the job anew.

The seal is a digest anyone can compute again: a plan edited and sealed anew is caught by its order.
On both stores (the plan row kept as the product keeps it), and as properties of the decoder.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_resumable.core.model.errors import ConfigurationError, CorruptCheckpoint
from airflow_resumable.core.readers.base import identity_digest
from airflow_resumable.core.stores import Store
from airflow_resumable.core.work.partitions import CorruptPlan, Plan, load_plan, save_plan

JOB, SLOT = "pt.export", "2026-03-01T00:00:00+00:00"
READER = {"kind": "keyset", "table": "pt_ids", "key": ["id"]}


def _stored(store: Store, state: dict[str, Any]) -> Any:
    """The slot's plan as :func:`load_plan` reads it after its row's state was set to ``state``."""
    with store.open(autocommit=True) as s:
        s.ensure_schema()
        save_plan(s, JOB, SLOT, Plan(4, (9, 19, 29), 40, READER))
        s.execute("UPDATE resumable_checkpoints SET state = %s WHERE job = %s", (json.dumps(state), f"{JOB}#plan"))
        s.commit()
        return load_plan(s, JOB, SLOT)


def _sealed(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` sealed anew, as anyone can: the seal is the digest of the rest."""
    rest = {k: v for k, v in state.items() if k != "seal"}
    return {**rest, "seal": identity_digest(rest)}


def test_a_plan_whose_seal_was_removed_is_refused_naming_the_plan_row_and_the_restart(store: Store) -> None:
    """Before: a plan without its seal was read unchecked (its boundaries edited at will)."""
    state = {k: v for k, v in Plan(4, (10, 30, 20), 40, READER).state().items() if k != "seal"}
    with pytest.raises(CorruptPlan) as err:
        _stored(store, state)
    assert isinstance(err.value, CorruptCheckpoint) and isinstance(err.value, ConfigurationError)
    assert (err.value.job, err.value.slot) == (f"{JOB}#plan", SLOT)
    assert err.value.message.startswith("the plan row's state is not a plan: it holds no seal")
    assert f"airflow resumable restart '{JOB}#plan' '{SLOT}'" in err.value.hint


def test_a_plan_edited_out_of_order_and_sealed_anew_is_refused_before_any_range_is_handed_out(store: Store) -> None:
    """Before: boundaries [10, 30, 20] were read as ranges (10, 30] and (20, end], which both hold
    rows 21 to 30: each written twice, and the summary succeeded ("10 gone, 20 more than planned")."""
    state = _sealed({**Plan(4, (9, 19, 29), 40, READER).state(), "boundaries": [10, 30, 20]})
    with pytest.raises(CorruptPlan) as err:
        _stored(store, state)
    assert isinstance(err.value, CorruptCheckpoint)
    assert (err.value.job, err.value.slot) == (f"{JOB}#plan", SLOT)
    assert "the plan row's boundaries are out of the key's order (boundary 1, 30, comes after boundary 2, 20)" in \
        err.value.message
    assert f"airflow resumable restart '{JOB}#plan' '{SLOT}'" in err.value.hint


def test_a_plan_refused_is_still_taken_over_by_the_restart_that_splits_the_job_anew(store: Store) -> None:
    """The planning task's restart and the jobs listing take a refused plan as a ConfigurationError,
    as before: the way out stays open."""
    with pytest.raises(ConfigurationError):
        _stored(store, {"partitions": 2, "boundaries": [1], "rows": 2})


@pytest.mark.parametrize(("boundaries", "partitions", "says"), [
    ([None, 5, None], 4, "boundary 2 is None, before every key, after boundary 1, 5"),
    ([5, 4.5], 3, "boundary 0, 5, comes after boundary 1, 4.5"),
    ([["a", 9], ["a", 3]], 3, "boundary 0, ['a', 9], comes after boundary 1, ['a', 3]"),
    ([[2, "x"], [1, "a"]], 3, "boundary 0, [2, 'x'], comes after boundary 1, [1, 'a']"),
    ([["a", 9], "b"], 3, "boundary 1, 'b', is not a key of the shape of boundary 0"),
    ([["a", 9], ["b"]], 3, "boundary 1, ['b'], is not a key of the shape of boundary 0"),
    # NaN comes after every number in PostgreSQL (ranges up to it take every key above 10, and so does the
    # last range), a text among numbers compares as its number there, a bool as no key: each passed before
    ([10, float("nan"), 20], 4, "boundary 1, nan, holds NaN"),
    ([["a", float("nan")], ["a", 1]], 3, "boundary 0, ['a', nan], holds NaN"),
    ([10, "7", 5], 4, "boundary 1, '7', is not a key of the shape of the boundaries before it"),
    ([10, True, 5], 4, "boundary 1, True, is not a key of the shape of the boundaries before it"),
    ([[1, 2], [1, "2"]], 3, "boundary 1, [1, '2'], is not a key of the shape of the boundaries before it"),
    # a text left for another never comes back in any collation's order (each passed before)
    (["a", "b", "a"], 4, "boundary 2, 'a', comes back to ['a'] after boundary 1, 'b'"),
    ([["a", 5], ["b", 1], ["a", 3]], 4, "boundary 2, ['a', 3], comes back to ['a']"),
    ([["a", "p"], ["a", "q"], ["a", "p"]], 4, "boundary 2, ['a', 'p'], comes back to ['a', 'p']"),
])
def test_boundaries_out_of_the_key_s_order_are_refused(boundaries: list[Any], partitions: int, says: str) -> None:
    state = _sealed({"partitions": partitions, "boundaries": boundaries, "rows": 10})
    with pytest.raises(CorruptPlan, match="out of the key's order") as err:
        Plan.from_state(state, job=f"{JOB}#plan", slot=SLOT)
    assert says in err.value.message


@pytest.mark.parametrize(("boundaries", "partitions"), [
    ([None, None, None], 4),  # fewer rows than partitions: ranges up to "before every key"
    ([None, 3, 3, 7], 5),  # a row deleted while the split was made: the boundary before stands in
    (["b", "B", "a"], 4),  # text: its order is the source's collation's (a linguistic one puts 'a' < 'B')
    ([["a", 30], ["b", 1]], 3),  # a composite key decided by its text column
    ([["a", 9], ["a", 9.0]], 3),
    ([1, 2.5, 3], 4),
])
def test_plans_the_split_makes_are_read(boundaries: list[Any], partitions: int) -> None:
    state = Plan(partitions, tuple(boundaries), 10).state()
    assert Plan.from_state(state, job=f"{JOB}#plan", slot=SLOT) == Plan(partitions, tuple(boundaries), 10)


@pytest.mark.parametrize("state", [
    {"partitions": True, "boundaries": [], "rows": 1},
    {"partitions": 0, "boundaries": [], "rows": 1},
    {"partitions": 10_001, "boundaries": list(range(10_000)), "rows": 1},
    {"partitions": 2, "boundaries": [1], "rows": -1},
    {"partitions": 2, "boundaries": [1], "rows": 2**63},
    {"partitions": 2, "boundaries": [1], "rows": "2"},
    {"partitions": 2, "boundaries": {"0": 1}, "rows": 2},
    {"partitions": 2, "boundaries": [1, 2], "rows": 2},
    {"partitions": 2, "boundaries": [1], "rows": 2, "reader": "keyset"},
])
def test_a_sealed_state_that_is_not_a_plan_is_refused(state: dict[str, Any]) -> None:
    with pytest.raises(CorruptPlan, match="the plan row's state is not a plan"):
        Plan.from_state(_sealed(state), job=f"{JOB}#plan", slot=SLOT)


_KEYS = st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=200)
@given(st.integers(0, 5), st.lists(_KEYS, min_size=1, max_size=12), st.integers(0, 2**63 - 1))
def test_every_plan_in_the_key_s_order_is_read_back_as_it_was_made(nones: int, keys: list[Any], rows: int) -> None:
    boundaries = ([None] * nones + sorted(keys))[:12]
    plan = Plan(len(boundaries) + 1, tuple(boundaries), rows, READER)
    assert Plan.from_state(json.loads(json.dumps(plan.state())), job=f"{JOB}#plan", slot=SLOT) == plan


@settings(max_examples=200)
@given(st.lists(st.integers(-1000, 1000), min_size=2, max_size=12, unique=True), st.data())
def test_every_plan_with_two_numbers_out_of_order_is_refused(keys: list[int], data: st.DataObject) -> None:
    boundaries = sorted(keys)
    i = data.draw(st.integers(0, len(boundaries) - 2))
    boundaries[i], boundaries[i + 1] = boundaries[i + 1], boundaries[i]
    state = Plan(len(boundaries) + 1, tuple(boundaries), 10).state()  # sealed as the product seals
    with pytest.raises(CorruptPlan, match=f"boundary {i}, {boundaries[i]}, comes after boundary {i + 1}"):
        Plan.from_state(state, job=f"{JOB}#plan", slot=SLOT)
