"""Whether this run is CI's: there a test never skips for what the machine lacks (a database, a tool,
a kernel feature): it fails, naming it (tests/conftest.py fails every skip but the Airflow-version
gates of :mod:`support.gates`)."""

from __future__ import annotations

import os


def in_ci() -> bool:
    """``CI=true`` (as CI services set it; ``.ci/run`` runs under it), or ``1``/``yes``."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")
