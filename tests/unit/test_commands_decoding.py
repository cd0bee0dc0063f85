"""``airflow resumable show`` and ``list`` print only rows the decoder reads: a slot's row edited by
hand out of its columns' ranges (a negative total) is refused, naming the column, the job, the slot
and the fix, and no figure of it (no negative percent) is printed. On both stores."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from airflow_resumable.core import Store
from support.module_cli import resumable_cli
from support.slots import SLOT, run_slot
from support.stores import empty_store

A = "dag_a.export"


@pytest.fixture
def edited(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A slot failed at 10 of 30, its total then edited by hand to -10 (and its processed to 5)."""
    s, uri = empty_store(store_kind, tmp_path, request)
    run_slot(s, A, "dag_a", fail_at=10)
    with s.open(autocommit=True) as session:
        session.execute("UPDATE resumable_checkpoints SET total = -10, processed = 5 WHERE job = %(job)s", {"job": A})
        session.commit()
    monkeypatch.setenv("AIRFLOW_CONN_RESUMABLE_DEFAULT", uri)
    return s


@pytest.mark.parametrize("output", ["table", "json"])
def test_show_refuses_a_row_with_a_negative_total_and_prints_no_percent(
        edited: Store, capsys: pytest.CaptureFixture[str], output: str) -> None:
    """Before: ``show`` printed the row with -50 % (and -100 % for processed over it)."""
    code, out, err = resumable_cli("show", A, SLOT, "--output", output, capsys=capsys)
    assert code == 1 and out == "", out
    assert "the stored total -10 is out of the column's range" in err and repr(A) in err and repr(SLOT) in err
    assert "UPDATE resumable_checkpoints SET total = NULL WHERE job = 'dag_a.export'" in err
    assert not re.search(r"-\d+(\.\d+)? ?%", out + err), out + err


def test_list_refuses_it_too(edited: Store, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = resumable_cli("list", "--output", "json", capsys=capsys)
    assert code == 1 and "the stored total -10 is out of the column's range" in err
    assert not re.search(r"-\d+(\.\d+)? ?%", out + err)
