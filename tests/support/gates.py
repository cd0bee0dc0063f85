"""The Airflow-version gates: the only skips CI accepts (``CI=true``: tests/conftest.py fails every
other skip there; docs/contributing.md says why).

A gate names a feature of :data:`~airflow_resumable.version_compat.FEATURES` (an Airflow minor
brings it). :func:`needs_airflow` skips a test of the feature on an older Airflow, with the
sentence the product itself says there (:func:`~airflow_resumable.version_compat.needs`);
:func:`before_airflow` skips a test of the way an older Airflow does without it, on an Airflow that
has it. ``make matrix`` runs the fast suite on every supported Airflow, so each side runs somewhere.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_resumable.version_compat import AIRFLOW_VERSION_STRING, FEATURES, needs, supports


def has(feature: str) -> str:
    """The reason a test of the way an older Airflow does without ``feature`` is skipped here."""
    (major, minor), _ = FEATURES[feature]
    return (f"{feature} is in Airflow {major}.{minor} and later (this is Airflow {AIRFLOW_VERSION_STRING}): "
            "the test is of an older Airflow's way without it")


def gate_reasons() -> frozenset[str]:
    """Every reason a gate gives on the installed Airflow: the skips CI accepts, exactly."""
    return frozenset(reason for feature in FEATURES for reason in (needs(feature), has(feature)))


def needs_airflow(feature: str) -> Any:
    """Skip the test on an Airflow older than ``feature`` needs, saying so."""
    return pytest.mark.skipif(not supports(feature), reason=needs(feature))


def before_airflow(feature: str) -> Any:
    """Skip the test (of the way an older Airflow does without ``feature``) on an Airflow that has it."""
    return pytest.mark.skipif(supports(feature), reason=has(feature))


def skip_unless(feature: str) -> None:
    """In a fixture or a test: skip on an Airflow older than ``feature`` needs, saying so."""
    if not supports(feature):
        pytest.skip(needs(feature))
