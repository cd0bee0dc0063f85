"""One attempt's progress, kept in one place.

A checkpoint travels one way: the run context encodes it, once, into a
:class:`~airflow_resumable.core.model.checkpoint.Write` and hands it to the attempt (``after_chunk``),
the attempt saves it, then records it here; the context, the reporter, the pipelined writer and the
attempt's end all read it from here. Nothing else keeps a copy.
"""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import datetime, timezone
from typing import Any

from airflow_resumable.core.attempt.reporter import ProgressMeter
from airflow_resumable.core.model.checkpoint import Checkpoint, Write

__all__ = ["Tally"]


class Tally:
    """Where the attempt stands: the last saved position, state and counts, and what is durable.

    Attributes:
        state: the JSON dict carried with the position (the handler mutates it, then checkpoints).
        processed: the count saved with the last checkpoint.
        total: the expected count (set by the handler; saved with the next checkpoint).
        durable: the last checkpoint known to be committed, None before the first: progress is
            reported from it (write before report). Set by the writer once its write is committed.
        save_seconds: how long the last direct save took (reported with progress), None when pipelined.
        checkpoints: how many checkpoints this attempt saved (lineage and tracing report it).
        skipped: the slot's skipped items after this attempt's last skip, None before its first.
        meter: the rate and ETA of this attempt's checkpoints (written with each, reported with progress).
        split_asked: who asked, as the last durable checkpoint read back, for part of the slot's
            remaining range (an idle partition of its job, rebalancing), or None.
    """

    __slots__ = ("_base", "_row", "_position", "_position_json", "state", "processed", "total", "saved_at",
                 "durable", "save_seconds", "checkpoints", "skipped", "meter", "split_asked")

    def __init__(self, row: Checkpoint):
        self._base = row
        self._row: Checkpoint | None = row
        self._position: Any = row.position
        self._position_json: str | None = None  # set by a save; decoded on first read
        self.state: dict[str, Any] = dict(row.state)
        self.processed: int = row.processed
        self.total: int | None = row.total
        self.saved_at: float | None = None
        self.durable: Write | None = None
        self.save_seconds: float | None = None
        self.checkpoints = 0
        self.skipped: int | None = None
        self.meter = ProgressMeter(row.processed)
        self.split_asked: str | None = None

    @property
    def position(self) -> Any:
        """The last saved position, as JSON gives it back (a tuple comes back as a list)."""
        if self._position_json is not None:
            self._position = json.loads(self._position_json)
            self._position_json = None
        return self._position

    @property
    def row(self) -> Checkpoint:
        """The checkpoint row as last written by this attempt (rebuilt only when read)."""
        if self._row is None:
            self._row = dataclasses.replace(
                self._base,
                position=self.position,
                state=self.state,
                processed=self.processed,
                total=self.total,
                updated_at=datetime.fromtimestamp(self.saved_at, tz=timezone.utc) if self.saved_at else None,
            )
        return self._row

    def reader_recorded(self, identity: Any) -> None:
        """The row now names the reader with ``identity`` (recorded by the attempt)."""
        self._base = dataclasses.replace(self._base, reader=identity)
        if self._row is not None:
            self._row = dataclasses.replace(self._row, reader=identity)

    def saved(self, write: Write, state: dict[str, Any]) -> None:
        """Record a checkpoint the store accepted: ``write``, encoded from the handler's ``state``
        dict (kept as it is: the handler goes on mutating it). Cheaply: the position is decoded, the
        row rebuilt, only when read. ``durable`` is left to whoever knows the write committed."""
        self._position_json = write.position
        self.state = state
        self.processed = write.processed
        self.total = write.total
        self.saved_at = time.time()
        self.checkpoints += 1
        self._row = None

    def __repr__(self) -> str:
        return f"Tally(position={self._position!r}, processed={self.processed}, total={self.total})"
