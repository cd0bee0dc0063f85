"""Ready-made ``read`` functions that page correctly and resume from the checkpoint's position.

Hand-written paging is where the bugs of this field live: cursors on a column that is not unique
skip or repeat rows, a missing ``ORDER BY`` loses some, an ``OFFSET`` reads the whole start again,
a cursor saved before the work is done loses a batch. A reader is correct by construction:

* :class:`KeysetReader`: rows of a table or a query, paged on a unique key (one column, or a
  composite key compared as a row value ``(a, b) > (%s, %s)``, so ties on the first column are
  neither skipped nor repeated). The position is the last row's key, as JSON. Each page is one
  index range scan: resuming at row 900,000 costs what resuming at row 10 does.
* :class:`FileReader`: lines, CSV records or JSON lines of a binary file object (a local file,
  or an object store's through the Airflow layer's ``object_reader``). The position is the byte
  offset after the last record: a resume seeks there instead of reading the start again.
* :class:`SequenceReader`: items of a sequence, or of an iterable a function makes, by index.

A reader is what ``ChunkedOperator(read=...)`` takes (``reader(ctx, after, limit)``); each batch
it returns is a :class:`Batch`, a list that also carries every item's position, so the chunk loop
needs no ``position=`` function. A handler that owns its loop iterates
``reader.chunks(ctx, size)`` and checkpoints ``batch.position`` after each batch.

No Airflow here: readers take a function that opens a DB-API connection or a binary file;
``airflow_resumable.readers`` builds those from Airflow connections and ``ObjectStoragePath``.

One module a part, each importing only those before it::

    base.py       Reader, Batch: what every reader is
    keys.py       the key codec: key values as an exact JSON position
    sql.py        the SQL checks: identifiers, the driver's placeholders
    keyset.py     KeysetReader
    file.py       FileReader
    sequence.py   SequenceReader
"""

from airflow_resumable.core.model.keys import json_key
from airflow_resumable.core.readers.base import Batch, Reader
from airflow_resumable.core.readers.file import FORMATS, FileReader
from airflow_resumable.core.readers.keyset import KeysetReader
from airflow_resumable.core.readers.sequence import SequenceReader
from airflow_resumable.core.readers.sql import placeholders

__all__ = ["FORMATS", "Batch", "FileReader", "KeysetReader", "Reader", "SequenceReader", "json_key", "placeholders"]
