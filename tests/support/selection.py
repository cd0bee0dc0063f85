"""What the matrix's selection plugins (``support.airflow_bound``, ``support.share``) share: leaving
tests out as ``-m`` and ``-k`` do, counted as deselected (not skipped, so CI's rule on skips is not
theirs to meet)."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def keep_only(config: pytest.Config, items: list[pytest.Item], keep: Callable[[pytest.Item], bool]) -> None:
    """Deselect the ``items`` that ``keep`` refuses, in place."""
    kept, left = [], []
    for item in items:
        (kept if keep(item) else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
