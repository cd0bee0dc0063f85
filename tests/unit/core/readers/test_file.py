"""The file reader: a file resumed at a byte offset without reading its start, CSV and JSON lines,
a last line still being written never split, encodings named with the fix.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_resumable.core import chunk_loop
from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.readers import FileReader
from airflow_resumable.core.stores import Store
from support.readers import SLOT, Crash, _crash_on, _load, attempt


class CountingFile(io.RawIOBase):
    """A binary file that counts the bytes it hands out and remembers where it was asked to seek."""

    def __init__(self, data: bytes):
        self._f = io.BytesIO(data)
        self.bytes_read = 0
        self.seeks: list[int] = []
        self.first_read_at: int | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.first_read_at is None:
            self.first_read_at = self._f.tell()
        data = self._f.read(len(b))
        b[: len(data)] = data
        self.bytes_read += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        self.seeks.append(offset)
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()


def opener(data: bytes, opened: list[CountingFile]) -> Callable[[], Any]:
    def open_() -> Any:
        f = CountingFile(data)
        opened.append(f)
        return f

    return open_

BIG = b"".join(f"line {i:05d}\n".encode() for i in range(2000))  # 11 bytes a line


def fingerprint(data: bytes) -> str:
    """A file position's fingerprint of the bytes before it, as the docs give it: BLAKE2b, 8 bytes, hex."""
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def offset_of(position: Any) -> Any:
    """The byte offset of a file reader's position (``{"offset", "window", "digest"}``)."""
    return position["offset"] if isinstance(position, dict) else position


def test_a_file_reader_resumed_at_a_byte_offset_does_not_read_the_start(store: Store) -> None:
    # Given attempt 1 read 10 chunks of 100 lines and then died
    opened: list[CountingFile] = []
    reader = FileReader(open=opener(BIG, opened))
    seen: list[str] = []
    with pytest.raises(Crash):
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: _crash_on(seen, b, "line 01000"), chunk_size=100))
    saved = _load(store, SLOT).position
    assert saved == {"offset": 1000 * 11, "window": 4096, "digest": fingerprint(BIG[1000 * 11 - 4096:1000 * 11])}
    # When attempt 2 resumes
    outcome = attempt(store, 2).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=100))
    # Then it read only the 4 KiB before the offset (to check them against the position's
    # fingerprint) and what follows, never the start
    retry = opened[-1]
    assert retry.seeks == [1000 * 11 - 4096] and retry.first_read_at == 1000 * 11 - 4096
    assert retry.bytes_read <= len(BIG) - 1000 * 11 + 4096
    assert seen == [f"line {i:05d}" for i in range(2000)]
    assert offset_of(outcome.checkpoint.position) == len(BIG) and outcome.checkpoint.processed == 2000

CSV = (
    b'id,name,comment\r\n'
    b'1,Ada,"likes ""quotes"""\r\n'
    b'2,Bob,"two\r\nlines"\r\n'
    b'\r\n'
    b'3,Cem,plain\r\n'
    + b"".join(f"{i},P{i},x\r\n".encode() for i in range(4, 21))
)


def test_a_csv_resume_reads_the_header_once_then_seeks_past_records_spanning_lines(store: Store) -> None:
    opened: list[CountingFile] = []
    reader = FileReader(open=opener(CSV, opened), format="csv")
    seen: list[dict[str, str]] = []
    with pytest.raises(Crash):
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: _crash_on(seen, b, {"id": "7", "name": "P7", "comment": "x"}),
                                         chunk_size=3))
    offset = offset_of(_load(store, SLOT).position)
    assert offset == CSV.index(b"7,P7")
    outcome = attempt(store, 2).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=3))
    assert [r["id"] for r in seen] == [str(i) for i in range(1, 21)]
    assert seen[0] == {"id": "1", "name": "Ada", "comment": 'likes "quotes"'}
    assert seen[1]["comment"] == "two\r\nlines"
    # The retry read the header (one line from the start), then the bytes before the saved offset (to
    # check them against the position's fingerprint: here, in a file under 4 KiB, the whole start)
    retry = opened[-1]
    assert retry.seeks == [0, 0] and retry.bytes_read == len(b"id,name,comment\r\n") + len(CSV)
    assert offset_of(outcome.checkpoint.position) == len(CSV)


def test_json_lines_are_parsed_and_a_bad_line_names_its_byte_offset(store: Store) -> None:
    data = b'{"a": 1}\n\n{"a": 2}\n{oops\n'
    reader = FileReader(open=lambda: io.BytesIO(data), format="jsonl")
    seen: list[Any] = []
    with pytest.raises(ConfigurationError, match="the line at byte 19 is not JSON"):
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=1))
    assert seen == [{"a": 1}, {"a": 2}]


def test_a_last_line_still_being_written_is_never_split_into_two_records(tmp_path: Path, store: Store) -> None:
    # Given a file whose writer is in the middle of its last line
    path = tmp_path / "feed.txt"
    path.write_bytes(b"alpha\nbeta\ngam")
    reader = FileReader(open=lambda: path.open("rb"))
    seen: list[str] = []
    # When the reader reaches it, not knowing whether the file is complete: the lines before it are
    # records, the line without its line break is not, and the run stops with a clear error
    with pytest.raises(ConfigurationError) as err:
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=2))
    text = str(err.value)
    assert f"{path}: the last line (at byte 11) has no line break" in text and f"slot='{SLOT}'" in text
    assert "complete=True" in text and "complete=False" in text
    assert seen == ["alpha", "beta"] and offset_of(_load(store, SLOT).position) == 11
    # Then once the line is written, a Clear resumes at it and reads it whole
    with path.open("ab") as f:
        f.write(b"ma\ndelta\n")
    attempt(store, 2).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=2))
    assert seen == ["alpha", "beta", "gamma", "delta"]


def test_a_growing_file_holds_its_unfinished_line_back_for_the_next_run(tmp_path: Path, store: Store) -> None:
    path = tmp_path / "feed.jsonl"
    path.write_bytes(b'{"n": 1}\n{"n": 2}\n{"n"')
    reader = FileReader(open=lambda: path.open("rb"), format="jsonl", complete=False)
    seen: list[Any] = []
    first = attempt(store, 1, "run-1").run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=5))
    # The run ends before the unfinished line, and the next run continues there once it is whole
    assert seen == [{"n": 1}, {"n": 2}] and offset_of(first.checkpoint.position) == 18
    with path.open("ab") as f:
        f.write(b': 3}\n')
    attempt(store, 1, "run-2").run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=5, start=18))
    assert seen == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_a_complete_file_without_a_final_line_break_reads_its_last_line_when_declared_complete(
    store: Store,
) -> None:
    reader = FileReader(open=lambda: io.BytesIO(b"alpha\nbeta\ngamma"), complete=True)
    seen: list[str] = []
    out = attempt(store, 1).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=2))
    assert seen == ["alpha", "beta", "gamma"] and offset_of(out.checkpoint.position) == 16


def test_a_csv_record_whose_quoted_field_is_still_being_written_is_not_returned(store: Store) -> None:
    # Given a CSV record spanning lines inside quotes, its closing quote not written yet
    data = b'id,note\n1,plain\n2,"first line\nsecond'
    seen: list[Any] = []
    held = FileReader(open=lambda: io.BytesIO(data), format="csv", complete=False)
    out = attempt(store, 1, "held").run(chunk_loop(held, lambda c, b: seen.extend(b), chunk_size=5))
    # Then it is held back whole (with complete=False), the position before it
    assert seen == [{"id": "1", "note": "plain"}] and offset_of(out.checkpoint.position) == data.index(b"2,")
    # and refused when the file is declared complete: a quote is missing
    broken = FileReader(open=lambda: io.BytesIO(data + b"\n"), format="csv", complete=True)
    with pytest.raises(ConfigurationError, match=r"the record at byte 16 \(line 3\) ends inside a quoted field"):
        attempt(store, 1, "broken").run(chunk_loop(broken, lambda c, b: None, chunk_size=5))


def test_a_csv_row_with_more_fields_than_the_header_is_refused_naming_the_file_and_the_row(
    tmp_path: Path, store: Store
) -> None:
    path = tmp_path / "people.csv"
    path.write_bytes(b"id,name\n1,Ada\n2,Bob,Smith\n3,Cem\n")
    reader = FileReader(open=lambda: path.open("rb"), format="csv")
    seen: list[Any] = []
    with pytest.raises(ConfigurationError) as err:
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=1))
    text = str(err.value)
    assert f"{path}: the record at byte 14 (line 3) has 3 fields" in text and "the header has 2 (id, name)" in text
    assert "'2,Bob,Smith'" in text and "Quote the field" in text and f"slot='{SLOT}'" in text
    assert seen == [{"id": "1", "name": "Ada"}] and offset_of(_load(store, SLOT).position) == 14


def test_a_file_in_another_encoding_fails_before_its_first_record_naming_the_encoding_and_the_fix(
    tmp_path: Path, store: Store
) -> None:
    # Given a Latin-1 file whose first non-ASCII byte is a few hundred lines in, and a UTF-16 file
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"".join(f"line {i:03d}\n".encode() for i in range(300)) + "café\n".encode("latin-1"))
    utf16 = tmp_path / "utf16.txt"
    utf16.write_bytes("alpha\nbeta\n".encode("utf-16"))
    seen: list[str] = []
    for path, expected in ((latin, "is not utf-8: byte 2703 (0xe9)"), (utf16, "starts with a UTF-16 byte order mark")):
        reader = FileReader(open=lambda path=path: path.open("rb"))
        with pytest.raises(ConfigurationError) as err:
            attempt(store, 1, path.name).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=10))
        text = str(err.value)
        # Then nothing was processed, and the error names the file, the encoding and the fix
        assert seen == [] and f"{path}: the file {expected}" in text and "encoding=" in text, text
    # and a file read with its own encoding reads
    attempt(store, 1, "latin-1").run(chunk_loop(FileReader(open=lambda: latin.open("rb"), encoding="latin-1"),
                                                lambda c, b: seen.extend(b), chunk_size=100))
    assert seen[-1] == "café" and len(seen) == 301


def test_a_byte_the_encoding_cannot_decode_deep_in_the_file_is_named_by_its_offset(store: Store) -> None:
    data = b"ok\n" * 30_000 + b"caf\xe9\n"  # past the first block the reader checks when it starts
    reader = FileReader(open=lambda: io.BytesIO(data), name="big.txt")
    with pytest.raises(ConfigurationError, match=r"big.txt: the line at byte 90000 \(line 30001\) is not utf-8 \(byte 90003"):
        attempt(store, 1).run(chunk_loop(reader, lambda c, b: None, chunk_size=1000))
    assert offset_of(_load(store, SLOT).position) == 90_000


def test_encodings_a_line_by_line_reader_cannot_read_are_refused_and_a_utf8_bom_is_not_data(store: Store) -> None:
    with pytest.raises(ConfigurationError, match="encoding 'utf-16' writes a line break as 2 bytes"):
        FileReader(open=lambda: io.BytesIO(b""), encoding="utf-16")
    reader = FileReader(open=lambda: io.BytesIO(b"\xef\xbb\xbfid,name\r\n1,Ada\r\n"), format="csv")
    seen: list[Any] = []
    attempt(store, 1).run(chunk_loop(reader, lambda c, b: seen.extend(b), chunk_size=5))
    assert seen == [{"id": "1", "name": "Ada"}]
