"""The operators' argument checks: at DAG parse time, and again once ``execute()`` has the
rendered (mapped, XCom) ``handler_kwargs``.

The checks of each argument are its declaration's (:mod:`airflow_resumable.core.model.options`,
:data:`airflow_resumable.core.work.chunk_loop.CHUNKED_OPTIONS`); this module joins them into one error
naming the task, and checks ``handler_kwargs`` against the functions that take them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.version_compat import XComArg

#: ``call_problems(keywords)``: why the task's functions cannot take their calls with these
#: ``handler_kwargs`` names (None: not known yet, only the positional part is checked).
CallProblems = Callable[[Collection[str] | None], list[str]]


def parse_time_problems(handler_kwargs: Any, call_problems: CallProblems) -> list[str]:
    """``handler_kwargs`` as given to the operator: a dict (its keys are known: rendering changes
    only the values) or an XCom of one (checked in full by :func:`run_time_problems`)."""
    if isinstance(handler_kwargs, Mapping):
        return call_problems(list(handler_kwargs))
    if isinstance(handler_kwargs, XComArg):
        return call_problems(None)
    return [f"handler_kwargs must be a dict of keyword arguments (or an XCom of one), got {type(handler_kwargs).__name__}"]


def run_time_problems(handler_kwargs: Any, call_problems: CallProblems) -> list[str]:
    """``handler_kwargs`` as rendered, in ``execute()``: a dict the functions take."""
    if not isinstance(handler_kwargs, Mapping):
        return [f"handler_kwargs must be a dict of keyword arguments, got {type(handler_kwargs).__name__}"]
    return call_problems(list(handler_kwargs))


def configuration_error(
    task_id: str, problems: list[str], *, hint: str, job: str | None = None, slot: str | None = None,
) -> ConfigurationError:
    """One error naming the task and every problem."""
    return ConfigurationError(f"task {task_id!r}: " + "; ".join(problems), job=job, slot=slot, hint=hint)
