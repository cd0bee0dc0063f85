"""A file reader's position knows the bytes before it (issues 31 and 32): a resume on a file that
is shorter, rewritten or replaced (log rotation) is refused naming the file, the offset and the
choices, or does what ``if_changed=`` says; never a cut line read as a record, never a silent
``done``. A file that only grew, or was replaced by an identical copy, resumes; 0.4.0's plain byte
offsets still resume.

Each test crashes a first attempt after some chunks (its checkpoint saved), changes the file, and
runs the retry on both stores.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import Attempt, chunk_loop
from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.model.identity import Identity
from airflow_resumable.core.readers import FileReader
from airflow_resumable.core.stores import Store


def fingerprint(data: bytes) -> str:
    """A file position's fingerprint of the bytes before it, as the docs give it: BLAKE2b, 8 bytes, hex."""
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def offset_of(position: Any) -> Any:
    return position["offset"] if isinstance(position, dict) else position


JOB, SLOT = "files.positions", "2026-03-01T00:00:00+00:00"
CHUNK = 5


class Crash(Exception):
    """Stands for the worker dying after a chunk's checkpoint."""


def lines(first: int, last: int, word: str = "line") -> bytes:
    return b"".join(f"{word} {i:04d}\n".encode() for i in range(first, last))  # 10 bytes a line for "line"


def run(store: Store, attempt: int, reader: FileReader, seen: list[Any], *, crash_after: int | None = None) -> Any:
    """One attempt of the chunk loop over ``reader``, five records a chunk, each record noted in
    ``seen``; it dies once ``crash_after`` records are done (their checkpoint saved)."""

    def process(ctx: Any, batch: list[Any]) -> None:
        if crash_after is not None and ctx.processed >= crash_after:
            raise Crash(f"died after {ctx.processed} records")
        seen.extend(batch)

    return Attempt(store, Identity(job=JOB, slot=SLOT, attempt=attempt, owner=f"owner-{attempt}")).run(
        chunk_loop(reader, process, chunk_size=CHUNK))


def row(store: Store) -> Any:
    with store.open() as s:
        return s.checkpoints.load(JOB, SLOT)


def first_attempt(store: Store, path: Path, data: bytes, **options: Any) -> tuple[FileReader, list[Any]]:
    """The file ``path`` with ``data``; attempt 1 reads 10 records and dies."""
    path.write_bytes(data)
    reader = FileReader(open=lambda: path.open("rb"), **options)
    seen: list[Any] = []
    with pytest.raises(Crash):
        run(store, 1, reader, seen, crash_after=10)
    assert offset_of(row(store).position) == 100
    return reader, seen


def refused(store: Store, reader: FileReader, seen: list[Any]) -> str:
    """Attempt 2 fails with the reader's refusal, reading nothing, the checkpoint kept: its text."""
    before = list(seen)
    with pytest.raises(ConfigurationError) as caught:
        run(store, 2, reader, seen)
    assert seen == before, "the refused attempt read records"
    r = row(store)
    assert (r.status, offset_of(r.position), r.processed) == ("failed", 100, 10)
    return str(caught.value)


def names_the_choices(text: str, path: Path) -> None:
    assert text.startswith(f"{path}: the file changed since byte 100 was read: "), text
    assert f"job='{JOB}'" in text and f"slot='{SLOT}'" in text
    assert f"airflow resumable restart {JOB} {SLOT}" in text and "if_changed='from_start'" in text
    assert "Nothing was read; the checkpoint is kept" in text


# -- refused --------------------------------------------------------------------------------------


def test_a_file_rewritten_shorter_than_the_saved_offset_is_refused_not_done(store: Store, tmp_path: Path) -> None:
    # Given attempt 1 read 10 lines of a 30-line file and died
    path = tmp_path / "feed.txt"
    reader, seen = first_attempt(store, path, lines(0, 30))
    # When the file is rewritten with 8 lines before the retry
    path.write_bytes(lines(0, 8))
    # Then the retry refuses, saying the file is shorter than the offset and what to do; not "done"
    text = refused(store, reader, seen)
    names_the_choices(text, path)
    assert "it is now 80 bytes, shorter than that" in text
    assert "if_changed='keep_offset'" in text


def test_a_rotated_log_a_new_file_at_the_same_path_is_refused_before_any_record(store: Store, tmp_path: Path) -> None:
    # Given attempt 1 read 10 lines of app.log and died
    path = tmp_path / "app.log"
    reader, seen = first_attempt(store, path, lines(0, 30))
    # When the log is rotated: app.log moved away, a new app.log with longer lines written in its place
    path.rename(tmp_path / "app.log.1")
    path.write_bytes(lines(0, 40, word="request"))
    # Then the retry refuses before reading anything (no line cut at byte 100 comes back as a record,
    # and the new file's first lines are not skipped)
    text = refused(store, reader, seen)
    names_the_choices(text, path)
    assert "the 100 bytes before it are not those read then" in text and "rotated log" in text


def test_a_file_truncated_then_refilled_to_the_same_size_is_refused(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "feed.txt"
    reader, seen = first_attempt(store, path, lines(0, 30))
    with path.open("r+b") as f:  # truncated in place, then other lines of the same length appended
        f.truncate(0)
        f.write(lines(100, 130))
    assert path.stat().st_size == len(lines(0, 30))
    assert "are not those read then" in refused(store, reader, seen)


def test_a_hand_edited_offset_does_not_match_its_fingerprint_and_is_refused(store: Store, tmp_path: Path) -> None:
    # Given a checkpoint whose offset someone moved by hand (to skip a line), its fingerprint as it was
    path = tmp_path / "feed.txt"
    reader, seen = first_attempt(store, path, lines(0, 30))
    with store.open() as s:
        position = row(store).position
        s.execute("UPDATE resumable_checkpoints SET position = %s WHERE job = %s",
                  (f'{{"offset": 110, "window": 100, "digest": "{position["digest"]}"}}', JOB))
        s.commit()
    with pytest.raises(ConfigurationError, match="the file changed since byte 110 was read"):
        run(store, 2, reader, seen)


@pytest.mark.parametrize("position", ['{"offset": 100}', '{"offset": 100, "window": 100, "digest": "zz"}',
                                      '{"offset": -1, "window": 0, "digest": "0000000000000000"}', '"100"'])
def test_a_position_that_is_not_a_file_readers_is_refused_naming_it(
    store: Store, tmp_path: Path, position: str
) -> None:
    path = tmp_path / "feed.txt"
    reader, seen = first_attempt(store, path, lines(0, 30))
    with store.open() as s:
        s.execute("UPDATE resumable_checkpoints SET position = %s WHERE job = %s", (position, JOB))
        s.commit()
    with pytest.raises(ConfigurationError, match="is not a file position"):
        run(store, 2, reader, seen)


def test_a_checkpoint_in_an_emptied_file_is_refused_and_an_empty_file_from_the_start_reads_nothing(
    store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "feed.txt"
    reader, seen = first_attempt(store, path, lines(0, 30))
    path.write_bytes(b"")
    assert "it is now 0 bytes, shorter than that" in refused(store, reader, seen)
    # and a fresh slot of an empty file ends done, having read nothing, its position at the start
    empty = FileReader(open=lambda: path.open("rb"))
    out = Attempt(store, Identity(job=JOB, slot="empty", attempt=1, owner="o")).run(
        chunk_loop(empty, lambda c, b: seen.extend(b), chunk_size=CHUNK))
    assert out.checkpoint.status == "done" and out.checkpoint.position is None and out.checkpoint.processed == 0


def test_a_last_line_read_as_complete_that_goes_on_later_is_refused_not_read_cut(store: Store, tmp_path: Path) -> None:
    # Given a run that read a file declared complete, whose last line has no line break (read whole
    # as a record), and ended at its end
    path = tmp_path / "feed.txt"
    path.write_bytes(lines(0, 9) + b"line 9")
    reader = FileReader(open=lambda: path.open("rb"), complete=True)
    seen: list[Any] = []
    first = Attempt(store, Identity(job=JOB, slot="run-1", attempt=1, owner="o")).run(
        chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=CHUNK))
    assert seen[-1] == "line 9" and first.checkpoint.position["offset"] == 96
    # When the line goes on after all (the file was not complete) and the next run starts where that
    # one ended, then it refuses: the rest of that line is not a record
    with path.open("ab") as f:
        f.write(b"99 and more\n")
    with pytest.raises(ConfigurationError, match="the line before it, read as the file's last record .complete=True., "
                                                 "goes on now"):
        Attempt(store, Identity(job=JOB, slot="run-2", attempt=1, owner="o")).run(
            chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=CHUNK, start=first.checkpoint.position))
    assert "99 and more" not in seen and len(seen) == 10


# -- what resumes ---------------------------------------------------------------------------------


def test_a_file_that_only_grew_or_was_replaced_by_an_identical_copy_resumes_every_line_once(
    store: Store, tmp_path: Path
) -> None:
    # Given attempt 1 read 10 lines and died; the file then replaced by a copy of itself (a new
    # inode, the same bytes: a restore, an editor's save), then grown by 5 lines
    path = tmp_path / "feed.txt"
    reader, seen = first_attempt(store, path, lines(0, 30))
    inode = path.stat().st_ino
    shutil.copy(path, tmp_path / "copy.txt")
    os.replace(tmp_path / "copy.txt", path)
    assert path.stat().st_ino != inode
    with path.open("ab") as f:
        f.write(lines(30, 35))
    # When the retry runs, then it resumes at the offset and reads every line once, to the new end
    out = run(store, 2, reader, seen)
    assert seen == [f"line {i:04d}" for i in range(35)] and out.checkpoint.status == "done"
    assert out.checkpoint.position == {"offset": 350, "window": 350, "digest": fingerprint(lines(0, 35))}


def test_a_position_saved_by_0_4_0_as_a_plain_offset_still_resumes_and_the_next_checkpoint_carries_the_fingerprint(
    store: Store, tmp_path: Path
) -> None:
    # Given a slot whose checkpoint 0.4.0 saved: the plain byte offset 100 (10 lines read)
    path = tmp_path / "feed.txt"
    reader, seen = first_attempt(store, path, lines(0, 30))
    with store.open() as s:
        s.execute("UPDATE resumable_checkpoints SET position = '100' WHERE job = %s", (JOB,))
        s.commit()
    # When this release resumes it, then it reads on from the offset and checkpoints the new format
    out = run(store, 2, reader, seen)
    assert seen == [f"line {i:04d}" for i in range(30)]
    assert out.checkpoint.position == {"offset": 300, "window": 300, "digest": fingerprint(lines(0, 30))}
    assert out.resumed_from == 100


@pytest.mark.parametrize(("data", "expected"), [
    (lines(0, 8), "it is now 80 bytes, shorter than that"),
    (b"x" + lines(0, 30), "it is inside a line of the file now (a record there would be read cut)"),
])
def test_a_0_4_0_offset_beyond_the_file_or_inside_a_line_is_refused(
    store: Store, tmp_path: Path, data: bytes, expected: str
) -> None:
    path = tmp_path / "feed.txt"
    reader, seen = first_attempt(store, path, lines(0, 30))
    with store.open() as s:
        s.execute("UPDATE resumable_checkpoints SET position = '100' WHERE job = %s", (JOB,))
        s.commit()
    path.write_bytes(data)
    with pytest.raises(ConfigurationError) as caught:
        run(store, 2, reader, seen)
    assert expected in str(caught.value) and len(seen) == 10


# -- the choices ----------------------------------------------------------------------------------


def test_if_changed_from_start_reads_a_rotated_log_from_its_first_byte_keeping_the_counts(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "app.log"
    path.write_bytes(lines(0, 30))
    reader = FileReader(open=lambda: path.open("rb"), if_changed="from_start")
    seen: list[Any] = []
    with pytest.raises(Crash):
        run(store, 1, reader, seen, crash_after=10)
    path.rename(tmp_path / "app.log.1")
    path.write_bytes(lines(0, 7, word="request"))
    with caplog.at_level(logging.WARNING, logger="airflow_resumable"):
        out = run(store, 2, reader, seen)
    # Then the new file is read whole, from its first line, and the slot's count goes on
    assert seen == [f"line {i:04d}" for i in range(10)] + [f"request {i:04d}" for i in range(7)]
    assert out.checkpoint.processed == 17 and out.checkpoint.position["offset"] == len(lines(0, 7, word="request"))
    assert "if_changed='from_start': reading it from its first byte" in caplog.text
    assert "what followed byte 100 in the file it replaced is not read" in caplog.text


def test_if_changed_from_start_rereads_a_csv_header_of_the_new_file(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "export.csv"
    path.write_bytes(b"id,name\n" + b"".join(f"{i},n{i:02d}\n".encode() for i in range(30)))
    reader = FileReader(open=lambda: path.open("rb"), format="csv", if_changed="from_start")
    seen: list[Any] = []
    with pytest.raises(Crash):
        run(store, 1, reader, seen, crash_after=10)
    path.write_bytes(b"id,name\n" + b"".join(f"{i},m{i:02d}\n".encode() for i in range(100, 104)))
    run(store, 2, reader, seen)
    assert seen[10:] == [{"id": str(i), "name": f"m{i:02d}"} for i in range(100, 104)]


def test_if_changed_keep_offset_continues_at_a_line_end_and_never_reads_a_cut_line(
    store: Store, tmp_path: Path
) -> None:
    # Given a file whose first lines were rewritten in place (the same lengths) after they were read
    path = tmp_path / "feed.txt"
    path.write_bytes(lines(0, 30))
    reader = FileReader(open=lambda: path.open("rb"), if_changed="keep_offset")
    seen: list[Any] = []
    with pytest.raises(Crash):
        run(store, 1, reader, seen, crash_after=10)
    path.write_bytes(lines(0, 10, word="LINE") + lines(10, 30))
    # When the retry declares the change harmless, then it continues at the offset
    run(store, 2, reader, seen)
    assert seen == [f"line {i:04d}" for i in range(30)]
    # but where the offset falls inside a line now, keep_offset refuses too: no cut line is a record
    seen.clear()
    slot_reader = FileReader(open=lambda: path.open("rb"), if_changed="keep_offset")
    path.write_bytes(lines(0, 30))
    with pytest.raises(Crash):
        Attempt(store, Identity(job=JOB, slot="cut", attempt=1, owner="o")).run(chunk_loop(
            slot_reader, _dies_after(10, seen), chunk_size=CHUNK))
    path.write_bytes(b"xyz" + lines(0, 30))
    with pytest.raises(ConfigurationError) as caught:
        Attempt(store, Identity(job=JOB, slot="cut", attempt=2, owner="o2")).run(chunk_loop(
            slot_reader, _dies_after(None, seen), chunk_size=CHUNK))
    assert "if_changed='keep_offset' cannot continue there" in str(caught.value)
    assert len(seen) == 10


def _dies_after(n: int | None, seen: list[Any]) -> Any:
    def process(ctx: Any, batch: list[Any]) -> None:
        if n is not None and ctx.processed >= n:
            raise Crash()
        seen.extend(batch)

    return process


def test_a_bad_if_changed_is_refused_when_the_dag_is_parsed() -> None:
    with pytest.raises(ConfigurationError, match="if_changed must be one of refuse, from_start, keep_offset"):
        FileReader(open=lambda: None, if_changed="accept")  # type: ignore[arg-type,return-value]


# -- through Airflow ------------------------------------------------------------------------------


def test_an_object_storage_file_replaced_between_attempts_is_refused_too(
    airflow_home: Path, store: Store, tmp_path: Path
) -> None:
    from airflow_resumable.readers import object_reader

    path = tmp_path / "feed.txt"
    path.write_bytes(lines(0, 30))
    reader = object_reader(f"file://{path}")
    seen: list[Any] = []
    with pytest.raises(Crash):
        run(store, 1, reader, seen, crash_after=10)
    os.replace(_written(tmp_path / "new.txt", lines(0, 30, word="other")), path)
    with pytest.raises(ConfigurationError) as caught:
        run(store, 2, reader, seen)
    assert f"file://{path}: the file changed since byte 100 was read" in str(caught.value)


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_rotated_log_fails_the_task_through_airflow_with_the_refusal_and_the_run_is_not_a_success(
    checkpoints: Store, run_dag, tmp_path: Path
) -> None:
    # Given a DAG reading app.log whose first try rotates the log (a new file moved over the path)
    # and dies after two chunks; the task has a retry
    path, rotated = tmp_path / "app.log", tmp_path / "next.log"
    path.write_bytes(lines(0, 30))
    rotated.write_bytes(lines(0, 40, word="request"))
    run_ = run_dag("se_file_rotated", conf={"path": str(path), "rotate": str(rotated)})
    # Then the retry fails without another retry, with the refusal as the task's error, and the run fails
    ti = run_.get_task_instance("work")
    assert str(run_.state) == "failed" and str(ti.state) == "failed" and ti.try_number == 2
    with checkpoints.open() as s:
        r = s.execute("SELECT status, last_error FROM resumable_checkpoints WHERE job = 'se_file_rotated.work'"
                      ).fetchone()
        s.commit()
    assert r[0] == "failed" and "app.log: the file changed since byte 100 was read" in r[1], r
    assert "if_changed='from_start'" in r[1]


def test_an_object_storage_url_with_credentials_in_it_is_named_without_them(airflow_home: Path) -> None:
    from airflow_resumable.readers import object_reader

    reader = object_reader("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/exports/feed.csv", format="csv")
    assert reader.name == "s3://***@bucket/exports/feed.csv" and "wJalrXUtnFEMI" not in repr(reader)
