"""The file reader: lines, CSV records or JSON lines of a binary file, by byte offset."""

from __future__ import annotations

import codecs
import csv
import hashlib
import itertools
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

from airflow_resumable.core.model.checkpoint import short
from airflow_resumable.core.model.observe import Source
from airflow_resumable.core.readers.base import Batch, Reader, check_arguments, close_quietly

if TYPE_CHECKING:
    from airflow_resumable.core.attempt.context import RunContext

__all__ = ["FORMATS", "IF_CHANGED", "WINDOW", "FileReader", "fingerprint"]

FORMATS = ("lines", "csv", "jsonl")

#: What a resume does when the file is not the one its position was read from (see :class:`FileReader`).
IF_CHANGED = ("refuse", "from_start", "keep_offset")

#: How many bytes before a position its fingerprint covers (fewer at the file's start).
WINDOW = 4096

#: The keys of a position (``offset``, and the fingerprint of the ``window`` bytes before it).
_KEYS = frozenset(("offset", "window", "digest"))
#: The largest window a position may name (a hand-edited one is not read for a gigabyte).
_MAX_WINDOW = 1 << 20

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

    The file is read as bytes and decoded line by line, so the encoding must keep ``\\n`` a single
    byte (UTF-8, Latin-1, ASCII...; UTF-16 and UTF-32 are refused). When an attempt starts at the
    first byte, the reader checks the first 64 KiB: a UTF-16/UTF-32 byte order mark, NUL bytes, or
    bytes the encoding cannot decode fail before any record is read (a UTF-8 byte order mark is
    skipped); a byte that cannot be decoded later fails at its line.

    **A position knows the bytes before it.** The checkpoint of a batch is
    ``{"offset": 360, "window": 360, "digest": "9b1e0f3a5c7d2e48"}``: the byte offset after its last
    record, and a fingerprint (BLAKE2b, 8 bytes) of the ``window`` bytes before it (the last
    4 KiB, fewer near the start). A resume reads those bytes again (one seek and one read, a ranged
    read on an object store) and compares: a file rewritten, truncated or replaced since (a rotated
    log, a new export at the same path) is noticed before any record, and so is a file now shorter
    than the offset; a file that only grew at its end, or was replaced by an identical copy, resumes.
    Device and inode numbers are not used: a copy, a restore or an editor's save changes them
    while the bytes stay the same, and object stores have none. Each item's own position (a skipped
    item's, in the dead letters) is its plain byte offset. A plain integer offset (what 0.4.0
    saved, or a ``start=``) still resumes: the file must hold that many bytes and the offset must be
    the end of a line (or of the file); the next checkpoint carries the fingerprint.

    ``if_changed`` says what a resume does when the file changed:

    * ``"refuse"`` (default): fail with ``ConfigurationError`` naming the file, the offset, what
      changed and the choices; nothing is read, the checkpoint is kept.
    * ``"from_start"``: read the file from its first byte (a rotated log: a new file), keeping the
      slot's counts and state; a warning says so. What followed the offset in the file it replaced
      is not read.
    * ``"keep_offset"``: continue at the saved offset of this file: you declare it only grows and
      the change before the offset does not matter (earlier records were rewritten in place, on
      purpose). Still refused when the file is now shorter than the offset or the offset falls
      inside a line: a cut line is never read as a record.

    Restarting the slot (its counts and state start over) reads the file from its start whatever
    ``if_changed`` says.

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
        if_changed: what a resume does when the file is not the one its position was read from:
            ``refuse`` (default), ``from_start`` or ``keep_offset`` (see above).

    Raises:
        ConfigurationError: bad arguments, all of them named at once. When reading: a record cut
            by the end of the file (with ``complete=None``), a CSV record with more fields than
            the header, bad JSON, a wrong encoding; each naming the file and the byte. When
            resuming: a file that changed (``if_changed="refuse"``), naming the offset and the
            choices; a position that is not this reader's.
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
        if_changed: str = "refuse",
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
        if if_changed not in IF_CHANGED:
            problems.append(f"if_changed must be one of {', '.join(IF_CHANGED)}, got {if_changed!r}")
        check_arguments("file", problems)
        self.open = open
        self.format = format
        self.encoding = encoding
        self.header = header and format == "csv"
        self.csv_options = dict(csv_options or {})
        self.complete = complete
        self.if_changed = if_changed
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
        # The raw lines before _offset (the last batch's, cut to WINDOW bytes at each mark): what
        # the fingerprint of a position at _offset covers. One list for the reader's life: _lines
        # appends to it (a list append a line: the cheapest note there is).
        self._raw: list[bytes] = []
        self._header_line: int | None = 1  # the line number after the CSV header

    def identity(self) -> dict[str, Any]:
        """The file's path, as given in ``name`` (see :meth:`Reader.identity`)."""
        return {"reader": "file", "path": self.name if self._named else None}

    def read(self, ctx: RunContext, after: Any, limit: int) -> Batch:
        offset, mark = self._position(ctx, after)
        if self._records is None or offset != self._offset:
            self._seek(ctx, offset, mark)
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
        return _FileBatch(items, positions, self._mark(positions[-1]) if positions else None)

    def _position(self, ctx: RunContext, after: Any) -> tuple[int, tuple[int, str] | None]:
        """``(offset, (window, digest))`` of a position; no fingerprint for a plain offset (0.4.0's
        positions, a ``start=``) or the start."""
        if after is None:
            return 0, None
        if type(after) is int and after >= 0:
            return after, None
        if type(after) is dict and after.keys() == _KEYS:
            offset, window, digest = after["offset"], after["window"], after["digest"]
            if (type(offset) is int and type(window) is int and min(offset, 1) <= window <= min(offset, _MAX_WINDOW)
                    and isinstance(digest, str) and len(digest) == 16 and not digest.strip("0123456789abcdef")):
                return offset, (window, digest)
        raise self._not_a_position(ctx, after, 'a file position (a byte offset, or {"offset", "window", "digest"} '
                                   "as this reader saves it)")

    def _seek(self, ctx: RunContext, offset: int, mark: tuple[int, str] | None) -> None:
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
            self._forget()
            first = next(csv.reader(self._lines(ctx), **self.csv_options), None)
            self._columns = list(first or [])
            self._data_start, self._header_line = self._offset, self._line
            self._held, self._end = None, False
        offset = max(offset, self._data_start)  # a fresh start begins after the header
        if offset > 0 and (mark is not None or offset != self._offset):
            offset = self._verify(ctx, offset, mark)  # the file at offset, its tail known
        else:
            if f.tell() != offset:
                f.seek(offset)
            if offset == 0:
                self._forget()
                self._line = 1
        self._offset = offset
        self._records = self._parse(ctx)

    # -- what a position knows of the bytes before it ---------------------------------------------

    def _verify(self, ctx: RunContext, offset: int, mark: tuple[int, str] | None) -> int:
        """Check the bytes before ``offset`` against the position's fingerprint (a plain offset:
        that it is a line's end), leaving the file at the offset to read from: ``offset``, or the
        start (``if_changed="from_start"``). One seek and one read.

        Raises:
            ConfigurationError: the file changed (``if_changed="refuse"``, or a change
                ``keep_offset`` cannot continue over), naming it, the offset and the choices.
        """
        f = self._file
        assert f is not None
        window = mark[0] if mark is not None else min(offset, WINDOW)
        f.seek(offset - window)
        before = _read(f, window)
        cut = not before.endswith(b"\n") and bool(f.read(1))  # a line goes on past the offset
        problem = None
        if len(before) < window:
            problem = f"it is now {self._size()} bytes, shorter than that"
        elif mark is not None and fingerprint(before) != mark[1]:
            problem = (f"the {window} bytes before it are not those read then (fingerprint {mark[1]}, now "
                       f"{fingerprint(before)}): the file was rewritten or replaced since (a rotated log, a new export?)")
        elif cut:
            problem = ("it is inside a line of the file now (a record there would be read cut)" if mark is None else
                       "the line before it, read as the file's last record (complete=True), goes on now: the file "
                       "grew after it was read as complete")
        if problem is None:
            return self._continue_at(offset, before)
        return self._changed(ctx, offset, problem, before if len(before) == window and not cut else None)

    def _changed(self, ctx: RunContext, offset: int, problem: str, before: bytes | None) -> int:
        """A resume at ``offset`` of a file that changed (``problem``): what ``if_changed`` says."""
        what = f"the file changed since byte {offset} was read: {problem}"
        log = getattr(ctx, "log", None)
        if self.if_changed == "from_start":
            if log is not None:
                log.warning("%s: %s; if_changed='from_start': reading it from its first byte (what followed byte %s "
                            "in the file it replaced is not read) [job=%s slot=%s]", self.name, what, offset,
                            getattr(ctx, "job", None), getattr(ctx, "slot", None))
            return self._from_start(ctx)
        if self.if_changed == "keep_offset" and before is not None:
            if log is not None:
                log.warning("%s: %s; if_changed='keep_offset': continuing at byte %s [job=%s slot=%s]", self.name, what,
                            offset, getattr(ctx, "job", None), getattr(ctx, "slot", None))
            return self._continue_at(offset, before)
        job = getattr(ctx, "job", None) or "<job>"
        slot = getattr(ctx, "slot", None) or "<slot>"
        keep = ("" if self.if_changed == "refuse" else
                "; if_changed='keep_offset' cannot continue there (no whole line ends at that byte now)")
        raise self._error(
            ctx, f"{what}{keep}. Nothing was read; the checkpoint is kept",
            f"Choose: restart the slot to read the file from its start, its counts and state too (the Checkpoint "
            f"tab's Restart, or `airflow resumable restart {job} {slot}`), then Clear the task; or pass "
            f"if_changed='from_start' to read this file from its first byte, keeping the slot's counts and state "
            f"(a rotated log: what followed byte {offset} in the file it replaced is not read)"
            + ("" if keep else f"; or if_changed='keep_offset' to continue at byte {offset} of this file (you know "
               "it only grew, and the change before that byte does not matter)")
            + "; then Clear the task",
        )

    def _continue_at(self, offset: int, before: bytes) -> int:
        """Resume at ``offset`` (the file is there), ``before`` the bytes before it."""
        f = self._file
        assert f is not None
        if f.tell() != offset:
            f.seek(offset)
        self._raw[:] = (before,)
        self._line = None  # resumed at a byte offset: the line numbers before it were not counted
        return offset

    def _from_start(self, ctx: RunContext) -> int:
        """Read the file again from its first byte (after its CSV header)."""
        f = self._file
        assert f is not None
        if f.seekable():
            self._check_start(ctx)
        f.seek(0)
        self._raw[:] = (_read(f, self._data_start),) if self._data_start else ()
        self._line = self._header_line if self._data_start else 1
        return self._data_start

    def _size(self) -> str:
        f = self._file
        try:
            assert f is not None
            return f"{f.seek(0, 2):,}"
        except Exception:  # a stream that cannot tell
            return "fewer"

    def _forget(self) -> None:
        self._raw.clear()

    def _mark(self, offset: int) -> dict[str, Any]:
        """The position at ``offset`` (a record's end): the offset and the fingerprint of the bytes
        before it. From the bytes in hand, unless the reader went on past it (blank lines, a
        record held back at the end): then read again (the last batch only)."""
        if offset == self._offset:
            raw, i, n = self._raw, len(self._raw), 0
            while i > 0 and n < WINDOW:  # the last lines, WINDOW bytes of them
                i -= 1
                n += len(raw[i])
            del raw[:i]
            data = b"".join(raw)[-WINDOW:]
            if len(data) == min(offset, WINDOW):
                return {"offset": offset, "window": len(data), "digest": fingerprint(data)}
        f = self._file
        assert f is not None
        here = f.tell()
        window = min(offset, WINDOW)
        f.seek(offset - window)
        data = _read(f, window)
        f.seek(here)
        return {"offset": offset, "window": window, "digest": fingerprint(data)}

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
        keep = self._raw.append
        while True:
            raw = readline()
            if not raw or not (whole or raw.endswith(b"\n")):
                if raw:
                    self._held = (self._offset, "has no line break")
                self._end = True
                return
            start = self._offset
            self._offset += len(raw)
            keep(raw)
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

    def source(self) -> Source | None:
        """The file this reader reads (the path or URL its opening function names, ``object_reader``'s;
        else its ``name``), with the Airflow connection that function names, if any."""
        path = getattr(self.open, "path", None)
        name = str(path) if path is not None else (self.name if self._named else None)
        if not name:
            return None
        return Source("file", name, getattr(self.open, "conn_id", None))

    def close(self) -> None:
        f, self._file = self._file, None
        self._records, self._columns, self._offset, self._data_start = None, None, 0, 0
        self._line, self._held, self._end = None, None, False
        self._forget()
        close_quietly(f)
        super().close()


class _FileBatch(Batch):
    """A file reader's batch: each item's position is its byte offset (a skipped item's, in the
    dead letters); the batch's :attr:`position`, what is checkpointed, also carries the fingerprint
    of the bytes before it."""

    def __init__(self, items: list[Any], offsets: list[int], mark: dict[str, Any] | None):
        super().__init__(items, offsets)
        self._mark = mark

    @property
    def position(self) -> Any:
        return self._mark


def _read(f: BinaryIO, n: int) -> bytes:
    """``n`` bytes of ``f`` (fewer only at its end): a raw file may hand out fewer in one read."""
    data = f.read(n)
    while len(data) < n:
        more = f.read(n - len(data))
        if not more:
            break
        data += more
    return data


def fingerprint(data: bytes) -> str:
    """The fingerprint of the bytes before a position: BLAKE2b, 8 bytes, as 16 hex digits."""
    return hashlib.blake2b(data, digest_size=8).hexdigest()

