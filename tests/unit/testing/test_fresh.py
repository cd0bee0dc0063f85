"""The test kit's process_death: the attempt's process is killed after a checkpoint and the run
resumes in a new process that imports the handler anew. A handler whose progress lives in the
process's memory is caught by it alone; a correct one passes; what cannot go to a new process is
refused, saying why."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import Options
from airflow_resumable.core.stores import SQLiteStore
from airflow_resumable.testing import (
    IN_PROCESS_INTERRUPTIONS,
    Interruption,
    NotImportable,
    NotResumable,
    check_chunked,
    check_resumable,
    fresh,
)
from airflow_resumable.testing.fresh import FreshProcesses, handler_payload, store_payload
from support.descriptors import past_fd_setsize

# -- process_death: a real crash, the run resumed in a new process -------------------------------


PARTS: dict[int, int] = {}


def keeps_its_total_in_a_module_global(ctx: Any) -> int:
    """Right in one process, wrong in production: each chunk's sum is kept in a module-level dict
    under the chunk's start (a repeated chunk writes the same entry again), not in ctx.state."""
    if ctx.position is None:
        PARTS.clear()
    i = ctx.position or 0
    while i < 20:
        PARTS[i] = sum(range(i + 1, i + 6))
        i += 5
        ctx.checkpoint(i, processed=i)
    return sum(PARTS.values())


def test_a_handler_keeping_its_total_in_a_module_global_passes_in_one_process_and_fails_a_real_crash_saying_why(
) -> None:
    # Given a handler whose running total lives in a module-level variable: every interruption that
    # stops the attempt inside the test's process leaves that memory, and the runs agree
    assert check_resumable(keeps_its_total_in_a_module_global, interruptions=IN_PROCESS_INTERRUPTIONS).ok
    # When the kit also kills the process after each checkpoint and resumes in a new one
    report = check_resumable(keeps_its_total_in_a_module_global)
    # Then process_death, and only it, differs at every checkpoint: 155 instead of 210 after checkpoint 2
    assert [(t.interruption, t.point) for t in report.failures] == [(Interruption.PROCESS_DEATH, p) for p in (1, 2, 3, 4)]
    assert report.failures[1].differences == ["the result differs: expected 210, got 155"]
    assert all(t.struck and t.attempts == 2 for t in report.failures)
    with pytest.raises(NotResumable) as err:
        report.assert_ok()
    text = str(err.value)
    assert text.startswith("keeps_its_total_in_a_module_global is not resumable: process_death at checkpoint 1 "
                           "(position 5): the result differs: expected 210, got 195 (4 of 32 interrupted runs"), text
    assert "the handler's progress lived outside ctx.state and the position, in the dead process's memory" in text
    assert "although crash_after_checkpoint at the same checkpoint, resumed in the same process, gave what" in text


def records_its_process(ctx: Any) -> int:
    """Appends to the file KIT_PROCESS_LOG names which process ran each chunk, and which process
    ran the handler's finally block."""
    log = Path(os.environ["KIT_PROCESS_LOG"])
    try:
        i = ctx.position or 0
        while i < 4:
            i += 1
            with log.open("a") as f:
                f.write(f"chunk {i} {os.getpid()}\n")
            ctx.state["n"] = i
            ctx.checkpoint(i, processed=i)
        return i
    finally:
        with log.open("a") as f:
            f.write(f"finally {os.getpid()}\n")


def test_process_death_kills_the_process_after_the_checkpoint_and_resumes_in_another_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a handler that writes down its process id, to a file named by an environment variable
    log = tmp_path / "processes.log"
    monkeypatch.setenv("KIT_PROCESS_LOG", str(log))
    # When the kit kills its process at checkpoint 2 (the file is emptied before each run)
    report = check_resumable(records_its_process, interruptions=[Interruption.PROCESS_DEATH], points=[2],
                             reset=lambda: log.write_text("")).assert_ok()
    # Then chunks 1-2 ran in one process, which died without its finally block running (no exception,
    # a kill), and chunks 3-4 in another one; neither is the test's process
    lines = [line.split() for line in log.read_text().splitlines()]
    killed, resumed = lines[0][2], lines[2][2]
    assert lines == [["chunk", "1", killed], ["chunk", "2", killed], ["chunk", "3", resumed],
                     ["chunk", "4", resumed], ["finally", resumed]]
    assert len({killed, resumed, str(os.getpid())}) == 3
    with pytest.raises(ProcessLookupError):
        os.kill(int(killed), 0)
    (trial,) = report.trials
    assert (trial.struck, trial.position, trial.attempts, trial.state) == (True, 2, 2, {"n": 4})


def sums_in_its_state(ctx: Any) -> int:
    """Right: the running total is in ctx.state, saved with each checkpoint."""
    i = ctx.position or 0
    while i < 20:
        ctx.state["total"] = ctx.state.get("total", 0) + sum(range(i + 1, i + 6))
        i += 5
        ctx.checkpoint(i, processed=i)
    return int(ctx.state["total"])


def test_a_correct_handler_survives_process_death_at_its_first_and_its_last_checkpoint() -> None:
    report = check_resumable(sums_in_its_state, interruptions=[Interruption.PROCESS_DEATH]).assert_ok()
    assert [t.point for t in report.trials] == [1, 2, 3, 4] and report.result == 210
    assert all(t.struck and t.attempts == 2 and t.result == 210 for t in report.trials)
    assert [t.position for t in report.trials] == [5, 10, 15, 20]


def test_process_death_works_in_a_test_process_holding_more_than_1024_open_files() -> None:
    # Given a test process whose pipes to the kit's process server are numbered past select()'s 1,024
    fresh.stop_server()
    with past_fd_setsize():
        # When the kit crashes and resumes a handler in new processes
        report = check_resumable(sums_in_its_state, interruptions=[Interruption.PROCESS_DEATH]).assert_ok()
        # Then it judges it as anywhere else (it waits on those pipes for each child's end)
        assert report.result == 210 and all(t.struck and t.attempts == 2 for t in report.trials)
    fresh.stop_server()  # the next checks start a server whose pipes are not the ones closed here


class Tally:
    """A handler as a callable object (and its bound method): ``in_state`` keeps the running total
    in ctx.state (right), else in the object's own attribute (wrong: a new process has its own)."""

    def __init__(self, in_state: bool):
        self.in_state = in_state
        self.parts: dict[int, int] = {}

    def __call__(self, ctx: Any) -> int:
        i = ctx.position or 0
        while i < 15:
            if self.in_state:
                ctx.state["total"] = ctx.state.get("total", 0) + i
            else:
                self.parts[i] = i
            i += 5
            ctx.checkpoint(i, processed=i)
        return int(ctx.state["total"]) if self.in_state else sum(self.parts.values())

    def run(self, ctx: Any) -> int:
        return self(ctx)


def test_callable_objects_and_bound_methods_go_to_the_new_process_as_they_were_before_any_run() -> None:
    kinds = [Interruption.CRASH_AFTER_CHECKPOINT, Interruption.PROCESS_DEATH]
    assert check_resumable(Tally(in_state=True), interruptions=kinds).ok
    assert check_resumable(Tally(in_state=True).run, interruptions=kinds).ok
    # the object's attribute survives in this process, not in a new one: it was sent before the reference
    # run filled it, as a worker builds the object anew
    wrong = check_resumable(Tally(in_state=False), interruptions=kinds, name="Tally(in_state=False)")
    assert {t.interruption for t in wrong.failures} == {Interruption.PROCESS_DEATH}
    assert not check_resumable(Tally(in_state=False).run, interruptions=kinds).ok


def read_numbers(ctx: Any, after: int | None, limit: int) -> list[int]:
    first = (after or 0) + 1
    return list(range(first, min(first + limit, 21)))


def add_numbers(ctx: Any, batch: list[int]) -> None:
    ctx.state["total"] = ctx.state.get("total", 0) + sum(batch)


def test_a_handler_a_new_process_cannot_import_is_refused_saying_it_must_be_importable() -> None:
    def closure(ctx: Any) -> int:  # defined inside a test: no module path names it
        return sums_in_its_state(ctx)

    with pytest.raises(NotImportable, match=r"^test_a_handler_a_new_process.*<locals>.closure: process_death runs "
                                            r"the resumed attempt in a new process.*The handler must be importable.*"
                                            r"interruptions=IN_PROCESS_INTERRUPTIONS"):
        check_resumable(closure)
    with pytest.raises(NotImportable, match=r"use operator.itemgetter\('id'\) for position=lambda"):
        check_chunked(read_numbers, add_numbers, chunk_size=5, chunked={"position": lambda n: n})
    # without process_death they are checked in this process, as before
    assert check_resumable(closure, interruptions=IN_PROCESS_INTERRUPTIONS).ok
    assert check_chunked(read_numbers, add_numbers, chunk_size=5, chunked={"position": lambda n: n},
                         interruptions=IN_PROCESS_INTERRUPTIONS).state == {"total": 210}
    # and importable ones go through process_death too
    assert check_chunked(read_numbers, add_numbers, chunk_size=5).state == {"total": 210}


def test_a_handler_defined_in_the_script_being_run_is_refused_naming_main(tmp_path: Path) -> None:
    script = tmp_path / "check.py"
    script.write_text(textwrap.dedent('''
        from airflow_resumable.testing import check_resumable

        def handler(ctx):
            ctx.checkpoint(1)
            return 1

        check_resumable(handler)
    '''))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 1
    assert "NotImportable: handler: process_death runs the resumed attempt in a new process" in result.stderr
    assert "defined in the script being run (__main__)" in result.stderr


SIDE_EFFECTS = '''
import os
from pathlib import Path

print("importing kit_side_effects", flush=True)  # on stdout, which carries nothing of the kit's
with open(os.environ["KIT_IMPORTS"], "a") as f:
    f.write(f"{os.getpid()}\\n")
if os.environ.get("KIT_REFUSE_IMPORT"):
    raise RuntimeError("kit_side_effects refuses to be imported here")
SCALE = int(os.environ.get("KIT_SCALE", "1"))  # read once, when the module is imported


def handler(ctx):
    numbers = [int(x) for x in Path(os.environ["KIT_NUMBERS"]).read_text().split()]
    i = ctx.position or 0
    while i < len(numbers):
        ctx.state["total"] = ctx.state.get("total", 0) + SCALE * sum(numbers[i:i + 2])
        i += 2
        ctx.checkpoint(i, processed=i)
    return ctx.state["total"]
'''


def test_a_handler_module_with_import_side_effects_is_imported_anew_by_each_new_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a handler module that prints and counts its imports, reads the environment when imported
    # and a file named by the environment when it runs
    (tmp_path / "kit_side_effects.py").write_text(SIDE_EFFECTS)
    (tmp_path / "numbers.txt").write_text(" ".join(str(i) for i in range(1, 9)))
    imports = tmp_path / "imports.txt"
    monkeypatch.setenv("KIT_IMPORTS", str(imports))
    monkeypatch.setenv("KIT_NUMBERS", str(tmp_path / "numbers.txt"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kit_side_effects", raising=False)
    m = importlib.import_module("kit_side_effects")
    # When the kit kills and resumes it at each of its 4 checkpoints
    report = check_resumable(m.handler, interruptions=[Interruption.PROCESS_DEATH]).assert_ok()
    # Then each new process imported it anew: this one once, the uninterrupted new process, and two a point
    assert report.result == 36 and len(report.trials) == 4
    pids = imports.read_text().split()
    assert len(pids) == 1 + 1 + 2 * 4 and len(set(pids)) == len(pids) and pids[0] == str(os.getpid())

    # A module that reads the environment when imported, changed since this process imported it: a
    # new process runs another handler, and the kit says so before any crash
    monkeypatch.setenv("KIT_SCALE", "2")
    changed = check_resumable(m.handler, interruptions=[Interruption.PROCESS_DEATH])
    (trial,) = changed.trials
    assert trial.point == 0 and trial.differences[0] == "the result differs: expected 36, got 72"
    with pytest.raises(NotResumable, match=r"process_death, an uninterrupted run in a new process: the result "
                                           r"differs.*depends on something this process holds and a new one does not"):
        changed.assert_ok()

    # A module whose import fails in a new process: named, with the import's error
    monkeypatch.setenv("KIT_REFUSE_IMPORT", "1")
    with pytest.raises(NotImportable, match=r"could not import the handler: RuntimeError: kit_side_effects refuses"):
        check_resumable(m.handler, interruptions=[Interruption.PROCESS_DEATH])


CHECKS_ITSELF = '''
import os

from airflow_resumable.testing import check_resumable

# Each new process that imports this module runs the check again (a bound keeps a regression finite).
depth = int(os.environ.get("KIT_DEPTH", "0"))
if depth > 3:
    raise RuntimeError(f"the check started again {depth} times")
os.environ["KIT_DEPTH"] = str(depth + 1)


def handler(ctx):
    i = ctx.position or 0
    while i < 3:
        i += 1
        ctx.state["n"] = ctx.state.get("n", 0) + 1
        ctx.checkpoint(i)
    return ctx.state["n"]


REPORT = check_resumable(handler, interruptions=["process_death"], points=[1])
'''


def test_a_handler_module_that_runs_a_check_when_imported_is_refused_instead_of_starting_it_again_and_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a module that runs the kit on its handler when it is imported (a check at its top level)
    (tmp_path / "kit_checks_itself.py").write_text(CHECKS_ITSELF)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("KIT_DEPTH", "0")
    monkeypatch.delitem(sys.modules, "kit_checks_itself", raising=False)
    # When it is imported: the check's new process imports it, which would run the check again
    # Then that second check is refused, saying why and what to do, and the first one fails with it
    with pytest.raises(NotImportable, match=r"could not import the handler: NotImportable: handler: a check of the "
                                            r"test kit started while a new process of process_death imported"):
        importlib.import_module("kit_checks_itself")


def test_a_sink_in_the_tests_memory_is_named_when_a_new_process_cannot_write_to_it() -> None:
    report = check_resumable(upserts_into_the_sink, snapshot=lambda: dict(SINK_ROWS), reset=SINK_ROWS.clear)
    assert {t.interruption for t in report.failures} == {Interruption.PROCESS_DEATH}
    (trial,) = report.failures
    assert trial.point == 0 and "the sink lives in this test's memory (a list, a dict)" in trial.differences[-1]
    with pytest.raises(NotResumable, match=r"leave this kind out: interruptions=IN_PROCESS_INTERRUPTIONS"):
        report.assert_ok()


SINK_ROWS: dict[int, int] = {}


def upserts_into_the_sink(ctx: Any) -> int:
    i = ctx.position or 0
    while i < 10:
        SINK_ROWS[i] = i * i
        i += 1
        ctx.checkpoint(i, processed=i)
    return i


def sleeps_in_a_new_process(ctx: Any) -> int:
    """Hangs where KIT_HANG is set (the new processes), not in the test's process."""
    if os.environ.get("KIT_HANG"):
        time.sleep(120)
    ctx.checkpoint(1)
    return 1


def test_an_attempt_that_hangs_in_a_new_process_is_killed_after_the_timeout_and_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload, preload = handler_payload(sleeps_in_a_new_process, Options(), label="sleeps")
    monkeypatch.setenv("KIT_HANG", "1")
    processes = FreshProcesses(payload, preload, timeout=1.0)
    try:
        began = time.monotonic()
        ended = processes.run(store_payload(SQLiteStore(tmp_path / "c.db"), label="sleeps"), mode="run")
    finally:
        processes.close()
    assert time.monotonic() - began < 60 and ended.killed
    assert ended.answer is not None and "did not end in 1s in a new process; it was killed" in ended.answer["text"]


def test_resumable_dag_test_refuses_process_death_naming_what_to_use(resumable_dag_test: Any) -> None:
    with pytest.raises(pytest.fail.Exception, match="process_death kills the attempt's process .* resumable_check"):
        resumable_dag_test(None, "total_revenue", "process_death")
