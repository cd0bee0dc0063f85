"""A plan records every range taken from a running slot (dynamic rebalancing's splits), and its
ranges as the splits left them hold every key once: a split cuts one range in two at a key inside
it. A plan row's splits are read whole or refused, as its boundaries are (``Plan.from_state``); a
plan stored before splits existed keeps its seal."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.readers.base import identity_digest
from airflow_resumable.core.work.partitions import CorruptPlan, Plan, Range, narrowed_since

JOB, SLOT = "pt.export#plan", "2026-03-01T00:00:00+00:00"
READER = {"kind": "keyset", "table": "pt_ids", "key": ["id"]}


def _owner(plan: Plan, key: int) -> list[str]:
    """The names of the ranges that hold ``key`` (an integer key; None bounds open)."""
    return [name for name, r in plan.current().items()
            if not r.empty and (r.after is None or r.after < key) and (r.until is None or key <= r.until)]


def test_a_split_cuts_one_range_in_two_at_a_key_inside_it_and_names_the_taken_range() -> None:
    plan = Plan(4, (10, 20, 30), 40, READER).with_split("1", 15, by="pt.export[3]", when="2026-03-01T00:05:00")
    current = plan.current()
    assert (current["1"].after, current["1"].until) == (10, 15)
    taken = current["1.1"]
    assert (taken.after, taken.until, taken.index, taken.split) == (15, 20, 1, 1)
    assert taken.job("pt.export") == "pt.export[1].1" and current["1"].job("pt.export") == "pt.export[1]"
    assert Range.from_json(taken.as_json()) == taken
    # a split of a split, and of the last (open) range
    plan = plan.with_split("1.1", 17).with_split("3", 35)
    current = plan.current()
    assert [(n, r.after, r.until) for n, r in sorted(current.items())] == [
        ("0", None, 10), ("1", 10, 15), ("1.1", 15, 17), ("1.2", 17, 20), ("2", 20, 30), ("3", 30, 35),
        ("3.3", 35, None)]
    assert plan.ranges() == Plan(4, (10, 20, 30), 40, READER).ranges()  # the mapped task instances' ranges


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(-5, 200)), max_size=25))
@settings(max_examples=200, deadline=None)
def test_whatever_splits_are_agreed_every_key_is_in_exactly_one_range(cuts: list[tuple[int, int]]) -> None:
    plan = Plan(4, (40, 80, 120), 160, READER)
    for pick, at in cuts:
        names = sorted(plan.current())
        try:
            plan = plan.with_split(names[pick % len(names)], at)
        except ConfigurationError:
            continue  # a key outside that range, or at its end: refused, the plan unchanged
    for key in range(-10, 220):
        assert len(_owner(plan, key)) == 1, (key, _owner(plan, key), plan.splits)
    assert Plan.from_state(plan.state(), job=JOB, slot=SLOT) == plan


def test_a_range_is_narrowed_since_a_read_of_its_plan_only_by_a_split_of_it_agreed_since() -> None:
    # Given a plan read once its range 0.1 was taken from range 0
    before = Plan(4, (10, 20, 30), 40, READER).with_split("0", 5)
    # Then a split of range 1 agreed since narrows range 1 (the same range up to the cut), and
    # leaves the others as they were read
    now = before.with_split("1", 15).with_split("2", 25)
    assert narrowed_since(before, now, "1") == Range(1, 10, 15, count=4, reader=identity_digest(READER))
    assert narrowed_since(before, now, "1") == now.current()["1"] != before.current()["1"]
    # (cut twice since: as the last cut left it)
    assert narrowed_since(before, now.with_split("1", 12), "1") == Range(1, 10, 12, count=4,
                                                                         reader=identity_digest(READER))
    assert narrowed_since(before, now, "3") is None
    assert narrowed_since(before, before, "1") is None
    assert narrowed_since(before, before.with_split("0.1", 7), "0.1") == before.with_split("0.1", 7).current()["0.1"]
    # And a plan changed otherwise since (split anew: other boundaries, or no longer its splits) is no narrowing
    anew = Plan(4, (10, 18, 30), 40, READER)
    assert narrowed_since(before, anew.with_split("0", 5).with_split("1", 15), "1") is None
    assert narrowed_since(before, Plan(4, (10, 20, 30), 40, READER).with_split("1", 15), "1") is None
    assert narrowed_since(before, Plan(4, (10, 20, 30), 41, READER).with_split("0", 5).with_split("1", 15), "1") is None


@pytest.mark.parametrize(("of", "at", "why"), [
    ("7", 5, "no range of the plan"),
    ("1", 10, "not inside"),   # at its own lower end: it would keep nothing
    ("1", 20, "not inside"),   # at its own upper end: the taken range would hold nothing
    ("1", 25, "not inside"),   # past its end: rows 21..25 read twice
    ("1", 3, "not inside"),    # before it
    ("1", None, "before every key"),
])
def test_a_split_outside_its_range_is_refused(of: str, at: Any, why: str) -> None:
    with pytest.raises(ConfigurationError, match=why):
        Plan(4, (10, 20, 30), 40, READER).with_split(of, at)


def test_a_plan_without_splits_keeps_the_seal_it_was_stored_with() -> None:
    plan = Plan(4, (10, 20, 30), 40, READER)
    rest = {"partitions": 4, "boundaries": [10, 20, 30], "rows": 40, "reader": READER}
    assert plan.state() == {**rest, "seal": identity_digest(rest)}


def _resealed(state: dict[str, Any]) -> dict[str, Any]:
    rest = {k: v for k, v in state.items() if k != "seal"}
    return {**rest, "seal": identity_digest(rest)}


@pytest.mark.parametrize(("edit", "why"), [
    (lambda s: s["splits"].append({"number": 2, "of": "1", "at": 18}), "not inside"),  # rows 16..18 twice
    (lambda s: s["splits"][0].update(number=3), "numbered 3 where 1 comes"),
    (lambda s: s["splits"][0].update(of="9"), "no range of the plan"),
    (lambda s: s["splits"][0].pop("at"), "not a dict of number, of and at"),
    (lambda s: s.update(splits={"1": 15}), "not a list"),
])
def test_a_plan_row_whose_splits_were_edited_is_refused_even_sealed_anew(edit: Any, why: str) -> None:
    state = Plan(4, (10, 20, 30), 40, READER).with_split("1", 15).state()
    edit(state)
    with pytest.raises(CorruptPlan, match=why):
        Plan.from_state(_resealed(state), job=JOB, slot=SLOT)
    with pytest.raises(CorruptPlan, match="changed after the plan was stored"):
        Plan.from_state({**state, "seal": Plan(4, (10, 20, 30), 40, READER).with_split("1", 15).state()["seal"]},
                        job=JOB, slot=SLOT)


@pytest.mark.parametrize(("plan", "at", "why"), [
    # A plan of one range has no boundary to compare the cut's shape with: its key's columns decide
    (Plan(1, (), 40, READER), (15,), "not a JSON position"),  # split_point's key, a tuple: read back as [15]
    (Plan(1, (), 40, READER), [15], "a list, but the plan's key has one column"),
    (Plan(1, (), 40, READER), {"id": 15}, "not a JSON position"),
    (Plan(1, (), 40, {**READER, "key": ["day", "id"]}), 15, "one value, but the plan's key has 2 columns"),
    (Plan(1, (), 40, {**READER, "key": ["day", "id"]}), ["2026-03-01"], "1 values, but the plan's key has 2"),
    (Plan(1, (), 40, {**READER, "key": ["day", "id"]}), ["2026-03-01", None], "not a list of texts and numbers"),
    (Plan(1, (), 40), {"id": 15}, "not a JSON position"),  # no reader recorded
])
def test_a_split_at_a_key_of_another_shape_than_the_plans_is_refused_and_so_is_one_edited_in(
        plan: Plan, at: Any, why: str) -> None:
    # Its ranges would be read as `id <= [15]`: every partition reading it would fail at its first chunk
    with pytest.raises(ConfigurationError, match=why):
        plan.with_split("0", at)
    state = plan.with_split("0", ["2026-03-01", 7] if plan.key_columns() == 2 else 15).state()
    state["splits"][0]["at"] = list(at) if isinstance(at, tuple) else at
    with pytest.raises(CorruptPlan, match="split 1 is not one this release reads"):
        Plan.from_state(_resealed(state), job=JOB, slot=SLOT)


def test_a_split_of_a_one_range_plan_at_a_key_of_its_shape_is_read_back_as_agreed() -> None:
    for plan, at in ((Plan(1, (), 40, READER), 15), (Plan(1, (), 40, {**READER, "key": ["day", "id"]}), ["d", 7]),
                     (Plan(1, (), 40), "m")):
        split = plan.with_split("0", at)
        assert Plan.from_state(split.state(), job=JOB, slot=SLOT) == split
        assert (split.current()["0"].until, split.current()["0.1"].after) == (at, at)
