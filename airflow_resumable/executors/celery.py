"""Drain resumable tasks when a Celery worker shuts down.

A Celery *warm* shutdown (SIGTERM to the worker's main process: a deploy, ``airflow celery stop``,
a pod stop whose init forwards the signal to that process only) stops taking tasks and waits for
the running ones to finish; it sends them no signal. A resumable task would then hold the deploy
for as long as it runs, or be killed at the end of the grace period and wait for Airflow's
heartbeat timeout. With this module loaded in the worker, the worker's shutdown makes every
resumable attempt it runs stop at its next chunk boundary with reason ``shutdown``: the attempt
fails as retryable, the retry resumes from its checkpoint on another worker, and the worker exits
about one chunk (plus a second) later. Tasks of other operators are left alone.

How: on ``worker_init`` the worker's main process names a drain flag file for itself and puts its
path in the environment, which its pool processes, their supervisors and the task processes
inherit (they are forked). On ``worker_shutting_down`` it creates the file. Every attempt's lease
keeper asks the stop source registered here once a second whether the file exists.

Enable it with one setting on the workers (it keeps Airflow's default Celery configuration)::

    [celery]
    celery_config_options = airflow_resumable.executors.celery.CELERY_CONFIG

or ``AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS=airflow_resumable.executors.celery.CELERY_CONFIG``. A
deployment with its own Celery configuration module imports this module from it instead.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path
from typing import Any

from celery.signals import worker_init, worker_shutdown, worker_shutting_down

from airflow_resumable.core.attempt.lease import add_stop_source
from airflow_resumable.core.attempt.signal import Reason
from airflow_resumable.version_compat import DEFAULT_CELERY_CONFIG

#: The environment variable that names this worker's drain flag file (inherited by its tasks).
DRAIN_FILE_ENV = "AIRFLOW_RESUMABLE_DRAIN_FILE"
#: Where the flag files go (default: the system's temporary folder).
DRAIN_DIR_ENV = "AIRFLOW_RESUMABLE_DRAIN_DIR"

#: Airflow's default Celery configuration; pointing ``[celery] celery_config_options`` here loads
#: this module in the worker, which is all the drain needs.
CELERY_CONFIG: dict[str, Any] = dict(DEFAULT_CELERY_CONFIG)


def drain_file(hostname: str | None = None, pid: int | None = None) -> Path:
    """The flag file of one worker: per host name and main process, so workers never share one."""
    folder = Path(os.environ.get(DRAIN_DIR_ENV) or tempfile.gettempdir())
    name = (hostname or socket.gethostname()).replace(os.sep, "_")
    return folder / f"airflow-resumable-drain-{name}-{pid or os.getpid()}"


def draining() -> tuple[str, str] | None:
    """The stop source: ``shutdown`` once this process's worker began shutting down."""
    path = os.environ.get(DRAIN_FILE_ENV)
    if path and os.path.exists(path):
        return Reason.SHUTDOWN.value, "the Celery worker is shutting down: stopping at the chunk boundary"
    return None


add_stop_source(draining)


@worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """In the worker's main process, before its pool starts: name the flag, clear a stale one."""
    path = drain_file(getattr(sender, "hostname", None))
    path.unlink(missing_ok=True)
    os.environ[DRAIN_FILE_ENV] = str(path)


@worker_shutting_down.connect
def _on_worker_shutting_down(**_: Any) -> None:
    """SIGTERM/SIGINT/SIGQUIT reached the main process: ask every running attempt to stop."""
    path = os.environ.get(DRAIN_FILE_ENV)
    if path:
        try:
            Path(path).touch()
        except OSError:  # nothing to drain with; the warm shutdown goes on as without us
            pass


@worker_shutdown.connect
def _on_worker_shutdown(**_: Any) -> None:
    """The pool has stopped: no attempt is left to read the flag."""
    path = os.environ.get(DRAIN_FILE_ENV)
    if path:
        Path(path).unlink(missing_ok=True)
