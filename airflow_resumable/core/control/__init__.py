"""Requests people make of a slot (pause, resume, cancel, restart, release), applied by the rules table.

The requests live in :mod:`airflow_resumable.core.control.requests`; their names are offered here too,
as ``airflow_resumable.core.control`` offered them before release 0.5.0 (deprecated: import them from
``requests``).
"""

from airflow_resumable.core.control.requests import *  # noqa: F403
from airflow_resumable.core.control.requests import __all__  # noqa: F401
