"""The file reader: lines, CSV records or JSON lines of a binary file, by byte offset."""

from __future__ import annotations

import codecs
import csv
import itertools
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

from airflow_resumable.core.checkpoint import short
from airflow_resumable.core.readers.base import Batch, Reader, check_arguments, close_quietly

if TYPE_CHECKING:
    from airflow_resumable.core.context import RunContext

__all__ = ["FORMATS", "FileReader"]

FORMATS = ("lines", "csv", "jsonl")

#: How much of a file the reader decodes when an attempt starts at its first byte: a wrong encoding
#: fails there, before any record, instead of deep into the run.
_HEAD = 64 * 1024

#: Byte order marks of encodings whose line break is not one byte (UTF-32 LE's first: it begins with UTF-16 LE's).
_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
              (codecs.BOM_UTF16_BE, "UTF-16"))


class FileReader(Reader):
    """Records of a file by byte offset: a resume seeks to the offset instead of reading the start.

    Formats: ``lines`` (each line as text, without its line break), ``jsonl`` (each non-blank line
    parsed as JSON) and ``csv`` (each record, which may span lines inside quotes; as a dict by the
    header when ``header`` is true, else as a list). With a header, the header is read once per
    attempt from the start of the file (one record), then the reader seeks to the position. A CSV
    record with more fields than the header is refused (a value would have no column).

    The position of a record is the byte offset just after it. The file is read as bytes and
    decoded line by line, so the encoding must keep ``\\n`` a single byte (UTF-8, Latin-1, ASCII...;
    UTF-16 and UTF-32 are refused). When an attempt starts at the first byte, the reader checks
    the first 64 KiB: a UTF-16/UTF-32 byte order mark, NUL bytes, or bytes the encoding cannot
    decode fail before any record is read (a UTF-8 byte order mark is skipped); a byte that cannot
    be decoded later fails at its line. A file that changes while it is read (other than growing
    at its end) breaks positions.

    **A record ends with its line break.** A last line without one (or, in CSV, a record whose
    quoted field runs into the end of the file) may still be being written, so it is never
    returned in part. ``complete`` says what it is:

    * ``None`` (default): the reader cannot tell. The records before it are returned; the next
      read fails (``ConfigurationError``) naming the file, the byte and both choices. The
      checkpoint is before the line, so a Clear after choosing continues there.
    * ``True``: the file is complete: a last line without a line break is a record (and a quoted
      field open at the end is an error: a quote is missing).
    * ``False``: the file is still written at its end (a log, a feed): the unfinished record is
      held back; the run ends before it, and the next attempt or run (``start=`` the position)
      reads it once its line break has arrived.

    Args:
        open: opens the file for reading in **binary** mode (``lambda: open(path, "rb")``); kept
            open for the attempt and closed when the loop ends.
        format: ``lines``, ``csv`` or ``jsonl``.
        encoding: the file's text encoding.
        header: CSV only: the first record names the columns (records become dicts).
        csv_options: CSV only: keyword arguments of :func:`csv.reader` (``delimiter``, ``quotechar``...).
        complete: whether the file is complete (see above); None: the reader cannot tell.
        name: names the file in errors (default: the opened file's ``name``, e.g. its path).

    Raises:
        ConfigurationError: bad arguments, all of them named at once. When reading: a record cut
            by the end of the file (with ``complete=None``), a CSV record with more fields than
            the header, bad JSON, a wrong encoding; each naming the file and the byte.
    """

    def __init__(
        self,
        *,
        open: Callable[[], BinaryIO],
        format: str = "lines",
        encoding: str = "utf-8",
        header: bool = True,
        csv_options: dict[str, Any] | None = None,
        complete: bool | None = None,
        name: str | None = None,
    ):
        super().__init__()
        problems = []
        if not callable(open):
            problems.append(f"open must be a function returning a binary file object, got {type(open).__name__}")
        if format not in FORMATS:
            problems.append(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
        try:
            codec = codecs.lookup(encoding)
        except (LookupError, TypeError):
            problems.append(f"unknown encoding {encoding!r}")
        else:
            encoder = codec.incrementalencoder()
            encoder.encode("x")  # past a byte order mark the encoder may write first
            line_break = encoder.encode("\n")
            if line_break != b"\n":
                problems.append(f"encoding {encoding!r} writes a line break as {len(line_break)} bytes; this reader "
                                "reads the file line by line, at its b'\\n' bytes (convert the file to UTF-8, e.g. "
                                "iconv -f UTF-16 -t UTF-8)")
        if csv_options and format != "csv":
            problems.append("csv_options apply to format='csv' only")
        if complete not in (None, True, False):
            problems.append(f"complete must be True, False or None, got {complete!r}")
        check_arguments("file", problems)
        self.open = open
        self.format = format
        self.encoding = encoding
        self.header = header and format == "csv"
        self.csv_options = dict(csv_options or {})
        self.complete = complete
        self.name = name or "file"
        self._named = name is not None
        self._utf8 = codec.name == "utf-8"
        self._file: BinaryIO | None = None
        self._offset = 0  # of the next byte self._file gives
        self._line: int | None = None  # the number of the line at self._offset, when the attempt knows it
        self._records: Iterator[Any] | None = None
        self._columns: list[str] | None = None
        self._data_start = 0  # the offset after the CSV header
        self._held: tuple[int, str] | None = None  # an unfinished last record: its offset, and what it lacks
        self._end = False  # the lines read so far reached the end of what the file holds

    def identity(self) -> dict[str, Any]:
        """The file's path, as given in ``name`` (see :meth:`Reader.identity`)."""
        return {"reader": "file", "path": self.name if self._named else None}

    def read(self, ctx: RunContext, after: Any, limit: int) -> Batch:
        offset = 0 if after is None else after
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise self._not_a_position(ctx, after, "a byte offset")
        if self._records is None or offset != self._offset:
            self._seek(ctx, offset)
        assert self._records is not None
        items, positions = [], []
        for record in itertools.islice(self._records, limit):
            items.append(record)
            positions.append(self._offset)
        if not items and self._held is not None and self.complete is None:
            at, lacking = self._held
            raise self._error(
                ctx, f"the last {'line' if self.format != 'csv' else 'record'} (at byte {at}) {lacking}: the file may "
                "still be being written, or it ends without one. The records before it were read; the checkpoint "
                "is before it",
                "Pass complete=True if the file is complete (its last line is a record too), or complete=False if "
                "it is still written at its end (the line is read once its line break has arrived); then Clear the "
                "task to resume",
            )
        return Batch(items, positions)

    def _seek(self, ctx: RunContext, offset: int) -> None:
        if self._file is None:
            self._file = self.open()
            if not self._named and isinstance(getattr(self._file, "name", None), str):
                self.name = self._file.name  # the path: what an error should name
            if offset == 0 and self._file.seekable():  # the attempt starts the file: check it before any record
                self._check_start(ctx)
        f = self._file
        self._held, self._end = None, False
        if self.header and self._columns is None:  # once per attempt: one record from the start
            f.seek(0)
            self._offset, self._line = 0, 1
            first = next(csv.reader(self._lines(ctx), **self.csv_options), None)
            self._columns = list(first or [])
            self._data_start = self._offset
            self._held, self._end = None, False
        offset = max(offset, self._data_start)  # a fresh start begins after the header
        if f.tell() != offset:
            f.seek(offset)
        if offset == 0:
            self._line = 1
        elif offset != self._offset:
            self._line = None  # resumed at a byte offset: the line numbers before it were not counted
        self._offset = offset
        self._records = self._parse(ctx)

    def _check_start(self, ctx: RunContext) -> None:
        """Fail on the file's first 64 KiB, before any record: a wide encoding's byte order mark, NUL
        bytes (UTF-16 without a mark, or not text), bytes ``encoding`` cannot decode."""
        assert self._file is not None
        head = self._file.read(_HEAD)
        self._file.seek(0)
        for mark, wide in _WIDE_BOMS:
            if head.startswith(mark):
                raise self._error(
                    ctx, f"the file starts with a {wide} byte order mark: it is {wide}, whose line breaks are not one "
                    f"byte, so it cannot be read line by line (encoding={self.encoding!r})",
                    f"Convert it to UTF-8 (e.g. iconv -f {wide} -t UTF-8) and read it with encoding='utf-8'",
                )
        if head.startswith(codecs.BOM_UTF8) and codecs.lookup(self.encoding).name not in ("utf-8", "utf-8-sig"):
            raise self._error(ctx, f"the file starts with a UTF-8 byte order mark, but encoding={self.encoding!r}",
                              "Read it with encoding='utf-8'")
        nul = head.find(b"\0")
        if nul >= 0:
            raise self._error(
                ctx, f"the file has a NUL byte at byte {nul}: it is UTF-16 or UTF-32 without a byte "
                f"order mark, or not text (encoding={self.encoding!r})",
                "Convert it to UTF-8 (e.g. iconv -f UTF-16LE -t UTF-8) and read it with encoding='utf-8', or check "
                "the path",
            )
        try:
            codecs.getincrementaldecoder(self.encoding)().decode(head, final=len(head) < _HEAD)
        except UnicodeDecodeError as exc:
            raise self._error(ctx, f"the file is not {self.encoding}: byte {exc.start} (0x{head[exc.start]:02x}) "
                              f"cannot be decoded ({exc.reason})", self._encoding_hint()) from None

    def _encoding_hint(self) -> str:
        return (f"Pass the file's encoding, e.g. encoding='cp1252' (a Windows export) or 'latin-1', or convert the "
                f"file to {self.encoding}; then Clear the task")

    def _where(self, offset: int, line: int | None) -> str:
        return f"byte {offset}" + (f" (line {line})" if line is not None else "")

    def _lines(self, ctx: RunContext) -> Iterator[str]:
        """The file's lines from the current offset, decoded, line breaks kept; each line moves
        ``_offset`` past its bytes as it is handed out (csv pulls exactly the lines of a record).

        A last line without its line break is not handed out unless the file is ``complete``: it
        may still be being written. ``_held`` then says where it starts (``_offset`` stays there),
        and ``_end`` that the lines ran out.
        """
        assert self._file is not None
        readline, encoding, whole = self._file.readline, self.encoding, self.complete is True
        while True:
            raw = readline()
            if not raw or not (whole or raw.endswith(b"\n")):
                if raw:
                    self._held = (self._offset, "has no line break")
                self._end = True
                return
            start = self._offset
            self._offset += len(raw)
            if self._line is not None:
                self._line += 1
            if start == 0 and self._utf8 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]  # a byte order mark, not data
            try:
                text = raw.decode(encoding)
            except UnicodeDecodeError as exc:
                raise self._error(ctx, f"the line at {self._where(start, self._line and self._line - 1)} is not "
                                  f"{encoding} (byte {start + exc.start}, 0x{raw[exc.start]:02x}: {exc.reason})",
                                  self._encoding_hint()) from None
            yield text

    def _parse(self, ctx: RunContext) -> Iterator[Any]:
        if self.format == "lines":
            for line in self._lines(ctx):
                yield line.rstrip("\r\n")
        elif self.format == "jsonl":
            for line in self._lines(ctx):
                if line.strip():
                    try:
                        value = json.loads(line)
                    except ValueError as exc:
                        start = self._offset - len(line.encode(self.encoding))
                        raise self._error(ctx, f"the line at byte {start} is not JSON ({exc}): {short(line, 60)}",
                                          "Fix the file, or read it with format='lines'") from None
                    yield value
        else:
            yield from self._csv_records(ctx)

    def _csv_records(self, ctx: RunContext) -> Iterator[Any]:
        columns = self._columns
        records = csv.reader(self._lines(ctx), **self.csv_options)
        while True:
            start, line = self._offset, self._line
            try:
                record = next(records)
            except StopIteration:
                return
            except csv.Error as exc:
                raise self._error(ctx, f"the record at {self._where(start, line)} is not CSV ({exc})",
                                  "Fix the file, or pass csv_options= that match it (delimiter=, quotechar=...)") from None
            if self._end:
                # csv asked for a line past the last one while in this record: a quoted field is still
                # open at the end of the file (csv would hand out the record cut there)
                if self.complete:
                    raise self._error(ctx, f"the record at {self._where(start, line)} ends inside a quoted field: a "
                                      "closing quote is missing", "Fix the file (a quote inside a quoted field is "
                                      "written twice: \"\"), or pass csv_options= that match it")
                self._held = (start, "ends inside a quoted field")
                return
            if not record:
                continue  # a blank line
            if columns is None:
                yield record
            elif len(record) > len(columns):
                text = self.csv_options.get("delimiter", ",").join(record)
                raise self._error(
                    ctx, f"the record at {self._where(start, line)} has {len(record)} fields but the header has "
                    f"{len(columns)} ({', '.join(columns)}): {short(text, 80)}; the extra value would have no column",
                    "Quote the field that holds the delimiter (\"Smith, Bob\"), add the column to the header, or "
                    "read with header=False (records as lists); then Clear the task to resume",
                )
            else:
                yield dict(zip(columns, record, strict=False))

    def close(self) -> None:
        f, self._file = self._file, None
        self._records, self._columns, self._offset, self._data_start = None, None, 0, 0
        self._line, self._held, self._end = None, None, False
        close_quietly(f)
        super().close()

