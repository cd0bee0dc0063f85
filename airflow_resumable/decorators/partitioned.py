"""``@task.resumable.partitioned``: the TaskFlow form of :func:`~airflow_resumable.operators.partitioned.partitioned`.

The decorated function processes one chunk of its partition's rows, as ``ChunkedOperator``'s
``process`` does (``fn(ctx, batch, **kwargs)``); calling it in a DAG builds the partitioned job's
task group (plan, the mapped partitions, summary) and returns it::

    @task.resumable.partitioned(read=sql_reader("warehouse", table="orders", key="id"), partitions=16,
                                chunk_size=500, tolerated_failure="10%")
    def export_orders(ctx, batch, *, target: str):
        ...

    prepare() >> export_orders(target="orders_export")

The group's id (and the job's name after the DAG's) is the function's name, or ``task_id=``
(given to the decorator or to ``.override(task_id=...)``). Arguments of the call are the
function's keyword arguments after the batch (``handler_kwargs``), for every partition; they are
rendered as templates like any templated argument. It is also importable as
``airflow_resumable.decorators.partitioned.partitioned_task``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.version_compat import TaskGroup

__all__ = ["partitioned_task"]


class PartitionedTask:
    """A decorated function, ready to become a partitioned job when called in a DAG."""

    def __init__(self, fn: Callable[..., Any], arguments: dict[str, Any]):
        _check_signature(fn)
        self.fn = fn
        self.arguments = arguments
        functools.update_wrapper(self, fn)

    def override(self, **arguments: Any) -> PartitionedTask:
        """The same function with some of the decorator's arguments replaced (``task_id=``,
        ``partitions=``, ``retries=``, ...), as TaskFlow's ``.override()``."""
        return PartitionedTask(self.fn, {**self.arguments, **arguments})

    def __call__(self, *args: Any, **kwargs: Any) -> TaskGroup:
        """The task group of the partitioned job, each partition calling the function with ``kwargs``.

        Raises:
            ConfigurationError: positional arguments (the function's first two are the run
                context and the batch), or the job's arguments are wrong.
        """
        from airflow_resumable.operators.partitioned import partitioned

        arguments = dict(self.arguments)
        task_id = arguments.pop("task_id", None) or self.fn.__name__
        if args:
            raise ConfigurationError(
                f"@task.resumable.partitioned {task_id!r}: call it with keyword arguments only (got {len(args)} "
                "positional): each partition calls the function as fn(ctx, batch, **kwargs)",
                hint=f"Write {self.fn.__name__}(name=value, ...)")
        given = dict(arguments.pop("handler_kwargs", None) or {})
        handler_kwargs = {**given, **kwargs}
        return partitioned(task_id=task_id, process=self.fn, handler_kwargs=handler_kwargs or None, **arguments)


def _check_signature(fn: Callable[..., Any]) -> None:
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if len(params) < 2:
        raise ConfigurationError(
            f"@task.resumable.partitioned function {fn.__name__!r} must take the run context and the batch first",
            hint=f"Write it as: def {fn.__name__}(ctx, batch, ...):")


def partitioned_task(python_callable: Callable[..., Any] | None = None, **arguments: Any) -> Any:
    """Declare a partitioned job on a function: ``partitioned(...)``'s arguments (``read``,
    ``partitions``, ``tolerated_failure``, and ``ChunkedOperator``'s: ``chunk_size``, ``retries``...)
    but ``process``, which is the function. Usable bare only when every required argument comes
    later through ``.override()``."""
    if "process" in arguments:
        raise ConfigurationError("@task.resumable.partitioned takes no process=: the decorated function is it",
                                 hint="Remove process= from the decorator's arguments")
    if python_callable is not None:
        return PartitionedTask(python_callable, arguments)
    return lambda fn: PartitionedTask(fn, arguments)
