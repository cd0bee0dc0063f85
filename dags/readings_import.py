"""Sensor readings import: slow enough to watch in the UI, with a skip policy. The UI tour's DAG.

Imports 600 sensor readings, 10 per checkpoint, into the table ``imported_readings`` beside the
checkpoints (the embedded SQLite store by default: no server, no connection to create). It
goes at a pace you choose: the DAG parameter ``seconds_per_reading`` (0.4 by default: about four
minutes a run) waits between readings, so you can watch the **Checkpoint** tab move, pause, resume,
cancel, mark it failed and Clear it. The wait is on the run's signal: once a pause or a cancel
reaches the run, the chunk under way finishes without waiting and the run stops at its checkpoint.

**The skip policy.** Four readings (ids 73, 222, 371 and 520) come from a sensor that reports in
°F, which this import refuses (``ValueError``). The task does not fail for them: ``skip_on`` records
each in the dead-letter table with its error, and the import goes on (at most ``skip_limit=10``
such readings, then the run fails). They show under **Skipped items** on the Checkpoint tab. Press
**Retry skipped items** and the task replays them through its own ``process``: they are refused
again and stay skipped, with the new try's error. Now allow °F: create the Airflow Variable
``readings_import_fahrenheit`` with the value ``true`` (Admin → Variables) and press **Retry
skipped items** again: the readings are converted, imported and marked ``replayed``.

**Exactly once.** Each reading is upserted through ``ctx.transaction()``, so the rows of a chunk
commit together with its checkpoint: an interruption keeps both or neither, and a retry or a Clear
continues after the last chunk saved. The running count and sum travel in the checkpoint's state.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from operator import itemgetter
from typing import Any

from airflow.sdk import DAG, Param

from airflow_resumable import ChunkedOperator, RunContext

READING_COUNT = 600
CHUNK = 10
#: The default pace: seconds per reading (600 readings: about four minutes).
SECONDS_PER_READING = 0.4
#: The Airflow Variable that lets the import accept readings in °F.
FAHRENHEIT_VARIABLE = "readings_import_fahrenheit"
#: The readings whose sensor reports in °F (refused until the Variable allows them).
FAHRENHEIT_IDS = tuple(i for i in range(1, READING_COUNT + 1) if i % 149 == 73)

READINGS_DDL = """
CREATE TABLE IF NOT EXISTS imported_readings (
    id INTEGER PRIMARY KEY,
    sensor TEXT NOT NULL,
    celsius_tenths INTEGER NOT NULL,
    import_attempt INTEGER NOT NULL
)"""
UPSERT = """
INSERT INTO imported_readings (id, sensor, celsius_tenths, import_attempt) VALUES (%s, %s, %s, %s)
ON CONFLICT (id) DO UPDATE SET sensor = excluded.sensor, celsius_tenths = excluded.celsius_tenths,
    import_attempt = excluded.import_attempt
"""


def reading(reading_id: int) -> dict[str, Any]:
    """One reading: deterministic stand-in data (replace with your source)."""
    tenths = 150 + (reading_id * 37) % 200  # 15.0 to 34.9 °C
    if reading_id in FAHRENHEIT_IDS:
        return {"id": reading_id, "sensor": "sensor-us-1", "value": round(tenths * 9 / 50 + 32, 2), "unit": "F"}
    return {"id": reading_id, "sensor": f"sensor-{reading_id % 8 + 1}", "value": tenths / 10, "unit": "C"}


def yes(value: Any) -> bool:
    """A templated flag as a boolean ("true", "1", "yes" in any case)."""
    return str(value).strip().lower() in ("true", "1", "yes")


# [START readings_import_functions]
def read_readings(ctx: RunContext, after: int | None, limit: int, **_: Any) -> list[dict[str, Any]]:
    """Up to ``limit`` readings after reading id ``after`` (None on a fresh start), in id order."""
    first = (after or 0) + 1
    return [reading(i) for i in range(first, min(first + limit, READING_COUNT + 1))]


def import_readings(ctx: RunContext, batch: list[dict[str, Any]], *, seconds_per_reading: Any = 0,
                    accept_fahrenheit: Any = False) -> None:
    """Convert each reading to tenths of °C and upsert it; a reading in °F is refused unless allowed.

    A refused reading raises ``ValueError``: the skip policy records it and the import goes on.
    """
    pace = float(seconds_per_reading or 0)
    ctx.transaction().execute(READINGS_DDL)  # commits with the chunk's checkpoint
    for item in batch:
        # A pause or a cancel ends the wait at once: the chunk's last readings go without waiting,
        # and the run stops at the chunk's checkpoint, nothing lost or repeated.
        ctx.signal.wait(pace)
        if item["unit"] == "F":
            if not yes(accept_fahrenheit):
                raise ValueError(f"reading {item['id']} from {item['sensor']} is in °F, which this import does "
                                 f"not accept: set the Airflow Variable {FAHRENHEIT_VARIABLE} to true, then "
                                 "retry the skipped items")
            tenths = round((item["value"] - 32) * 50 / 9)
        else:
            tenths = round(item["value"] * 10)
        ctx.transaction().execute(UPSERT, (item["id"], item["sensor"], tenths, ctx.attempt))
        ctx.state["count"] = ctx.state.get("count", 0) + 1
        ctx.state["celsius_tenths"] = ctx.state.get("celsius_tenths", 0) + tenths
# [END readings_import_functions]


# [START readings_import_dag]
with DAG(
    dag_id="readings_import",
    schedule=None,  # trigger it from the UI
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    tags=["resumable", "example"],
    doc_md=__doc__,
    params={
        "seconds_per_reading": Param(SECONDS_PER_READING, type="number", minimum=0, maximum=60,
                                     description="The pace: seconds to wait before each reading (0.4: about "
                                     "four minutes for the 600 readings; 0: as fast as it goes)"),
    },
) as dag:
    ChunkedOperator(
        task_id="import_readings",
        read=read_readings,
        process=import_readings,
        chunk_size=CHUNK,  # a checkpoint every 10 readings; a stop lands within the chunk under way
        position=itemgetter("id"),  # a top-level callable: the test kit's process_death pickles it
        total=READING_COUNT,
        skip_on=ValueError,  # a refused reading goes to the dead letters, the import goes on
        skip_limit=10,  # past 10 refused readings the run fails: something is wrong, not one reading
        handler_kwargs={
            "seconds_per_reading": "{{ params.seconds_per_reading }}",
            # Read when each try starts: set the Variable, then retry the skipped items.
            "accept_fahrenheit": "{{ var.value.get('" + FAHRENHEIT_VARIABLE + "', 'false') }}",
        },
        lease=15,  # heartbeat every 5 s; a pause or cancel comes with the next checkpoint or heartbeat
        progress_interval=5,  # rate and ETA in the task log every 5 s
        timeout=timedelta(hours=2),
        retries=2,
        retry_delay=timedelta(seconds=5),
    )
# [END readings_import_dag]
