"""``@task.resumable``: the TaskFlow twin of :class:`ResumableOperator`.

The decorated function takes the run context first, then the task's arguments::

    @task.resumable(timeout=3000, overlap="skip")
    def export(ctx, batch_size: int = 200):
        ...

Arguments given when the task is called (plain values or upstream XComs) are rendered like any
TaskFlow task's; context keys named in the signature (``ti``, ``dag_run``, ``params``...) are
passed too.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Sequence
from typing import Any

from airflow_resumable.core.attempt.context import RunContext
from airflow_resumable.core.model.errors import ConfigurationError
from airflow_resumable.core.model.options import call_problem
from airflow_resumable.operators.outcome import to_airflow
from airflow_resumable.operators.resumable import ResumableOperator
from airflow_resumable.version_compat import (
    Context,
    DecoratedOperator,
    KeywordParameters,
    built_from_mapped,
    task_decorator_factory,
)


def _without_ctx(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in whose signature lacks the leading ``ctx``, for TaskFlow's argument checks."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise ConfigurationError(
            f"@task.resumable function {fn.__name__!r} must take the run context as its first parameter",
            hint=f"Write it as: def {fn.__name__}(ctx, ...):",
        )

    @functools.wraps(fn)
    def stand_in(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise RuntimeError("called without a run context")

    # Function attributes mypy cannot see: inspect.signature() honours __signature__, and the
    # operator finds the real function through __resumable_fn__.
    setattr(stand_in, "__signature__", sig.replace(parameters=params[1:]))  # noqa: B010
    setattr(stand_in, "__resumable_fn__", fn)  # noqa: B010
    return stand_in


class _ResumableDecoratedOperator(DecoratedOperator, ResumableOperator):
    """Runs the decorated function as a resumable handler."""

    custom_operator_name = "@task.resumable"
    # The function's arguments stand in for handler_kwargs; the other templated arguments stay.
    template_fields: Sequence[str] = (
        "op_args", "op_kwargs", *(f for f in ResumableOperator.template_fields if f != "handler_kwargs"),
    )
    template_fields_renderers = {"op_args": "py", "op_kwargs": "py"}
    shallow_copy_attrs: Sequence[str] = ("python_callable", "resumable_fn")

    def __init__(self, *, python_callable: Callable[..., Any], op_args: Any = None, op_kwargs: Any = None, **kwargs: Any):
        fn = getattr(python_callable, "__resumable_fn__", None) or python_callable
        stand_in = python_callable if fn is not python_callable else _without_ctx(fn)
        self.resumable_fn = fn
        # A mapped instance is built on the worker, outside execute(), where TaskFlow's own argument
        # check would fail the try and spend a retry. Let it check only what it can (bind_partial);
        # execute() then refuses a missing argument without a retry, and an unexpected one is
        # refused here the same way.
        from_mapped = built_from_mapped(self)
        if from_mapped:
            kwargs["_airflow_mapped_validation_only"] = True
        try:
            super().__init__(
                python_callable=stand_in,
                op_args=op_args,
                op_kwargs=op_kwargs,
                kwargs_to_upstream={"handler": fn},
                **kwargs,
            )
        except TypeError as exc:
            if not from_mapped:
                raise
            error = ConfigurationError(
                f"task {kwargs.get('task_id')!r}: the @task.resumable function {fn.__name__!r} cannot take "
                f"its mapped arguments: {exc}",
                hint="Change the function's signature or the mapped arguments; nothing was run or written",
            )
            # Job and slot are not known yet; to_airflow only needs them for a cancel.
            raise (to_airflow(error, job="", slot="") or error) from exc

    @property
    def is_async(self) -> bool:
        """False: an ``async def`` function is driven by the attempt's own event loop, inside
        ``execute()``, never by Airflow's async operator path (whose loop knows only the timeout,
        not the run's other stop sources: a cancel or pause request, SIGTERM, a lost lease)."""
        return False

    def _arguments(self, context: Context) -> tuple[list[Any], dict[str, Any]]:
        """The arguments the function gets after the run context: the task's, and context keys it names."""
        merged = {**context, **self.op_kwargs}
        kwargs = dict(KeywordParameters.determine(self.python_callable, self.op_args, merged).unpacking())
        return list(self.op_args), kwargs

    def _handler(self, context: Context) -> Callable[[RunContext], Any]:
        args, kwargs = self._arguments(context)
        fn = self.resumable_fn
        return lambda ctx: fn(ctx, *args, **kwargs)

    def _call_problems(self, keywords: Collection[str] | None, context: Context | None) -> list[str]:
        """At parse time TaskFlow checks the arguments itself; execute() checks the call as made
        (``.expand_kwargs()`` names are known only then)."""
        if context is None:
            return []
        args, kwargs = self._arguments(context)
        params = ("ctx", *(f"<argument {i + 1}>" for i in range(len(args))))
        problem = call_problem(self.resumable_fn, "the @task.resumable function", params, kwargs)
        return [problem] if problem else []


def resumable_task(python_callable: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """Turn ``fn(ctx, ...)`` into a resumable task. Takes :class:`ResumableOperator`'s arguments.

    ``@task.resumable.partitioned(read=..., partitions=N, ...)`` declares a partitioned job on a
    chunk function instead (:mod:`airflow_resumable.decorators.partitioned`)."""
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=False,
        decorated_operator_class=_ResumableDecoratedOperator,
        **kwargs,
    )


def _partitioned(python_callable: Callable[..., Any] | None = None, **arguments: Any) -> Any:
    from airflow_resumable.decorators.partitioned import partitioned_task

    return partitioned_task(python_callable, **arguments)


# ``task.resumable`` is this function (the provider info's task decorator): ``task.resumable.partitioned``.
resumable_task.partitioned = _partitioned  # type: ignore[attr-defined]
