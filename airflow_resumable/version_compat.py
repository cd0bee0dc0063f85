"""Every import from Airflow that could move between versions, in one place.

The package targets Airflow 3.3 (task SDK 1.3); operators, hooks and exceptions come from the
task SDK, the public surface DAG authors use.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import BaseHook, BaseOperator, Context, XComArg
from airflow.sdk.bases.decorator import DecoratedOperator, KeywordParameters, task_decorator_factory
from airflow.sdk.configuration import conf
from airflow.sdk.definitions.retry_policy import ExceptionRetryPolicy, RetryAction, RetryDecision, RetryPolicy
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowNotFoundException,
    AirflowRescheduleException,
    AirflowSkipException,
)
from airflow.sdk.observability.stats import Stats
from airflow.sdk.serde import deserialize as serde_deserialize
from airflow.sdk.serde import serialize as serde_serialize
from airflow.triggers.base import BaseTrigger, TriggerEvent


def built_from_mapped(operator: object) -> bool:
    """Whether Airflow is building ``operator`` as a mapped task instance, on the worker and outside
    ``execute()``: BaseOperator's private ``__from_mapped`` flag (Airflow 3.3; no public name)."""
    return bool(getattr(operator, "_BaseOperator__from_mapped", False))


__all__ = [
    "AirflowException",
    "AirflowFailException",
    "AirflowNotFoundException",
    "AirflowPlugin",
    "AirflowRescheduleException",
    "AirflowSkipException",
    "BaseHook",
    "BaseOperator",
    "BaseTrigger",
    "Context",
    "DecoratedOperator",
    "ExceptionRetryPolicy",
    "KeywordParameters",
    "RetryAction",
    "RetryDecision",
    "RetryPolicy",
    "Stats",
    "conf",
    "TriggerEvent",
    "XComArg",
    "built_from_mapped",
    "serde_deserialize",
    "serde_serialize",
    "task_decorator_factory",
]
