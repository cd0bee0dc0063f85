"""Every default, in one place: the core's options, the operators' arguments and the docs' API
table (``tests/system/test_docs.py`` checks the table) all read them from here."""

from __future__ import annotations

#: Seconds a slot's lease lasts without renewal; renewed every ``LEASE / 3``.
LEASE = 30.0
#: What a run does when an earlier run of the same job is still live.
OVERLAP = "skip"
#: Seconds between progress lines in the log.
PROGRESS_INTERVAL = 10.0
#: Seconds between the cooperative ``timeout`` and the ``execution_timeout`` backstop.
TIMEOUT_GRACE = 60.0
#: Seconds between checks while ``overlap="wait"``, and how long it waits in all.
OVERLAP_POKE = 30.0
OVERLAP_TIMEOUT = 3600.0
#: Seconds between pushes of the checkpoint row to XCom.
XCOM_INTERVAL = 5.0
#: The Airflow connection of the checkpoint store.
CONN_ID = "resumable_default"
#: A throttle wait at least this long gives the worker back (the task defers); a shorter one
#: sleeps on the run's signal.
DEFER_AFTER = 60.0
#: Seconds between the paused task's checks for a resume or a cancel (in Airflow's triggerer).
RESUME_POLL = 1.0
#: How many items of a slot a skip policy (``skip_on=``) may skip before the attempt fails.
SKIP_LIMIT = 10
#: How many skipped items the task's summary (its XCom return value) lists (all are counted).
SKIPPED_SHOWN = 5
#: Whether a checkpoint's durable write overlaps the next chunk's work (one write in flight).
PIPELINE_CHECKPOINTS = False
#: Slots removed per transaction by ``clean``: short transactions, short locks.
CLEAN_BATCH = 1000
