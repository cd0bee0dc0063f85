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
from collections.abc import Callable, Sequence
from typing import Any

from airflow_resumable.core.context import RunContext
from airflow_resumable.core.errors import ConfigurationError
from airflow_resumable.operators.resumable import ResumableOperator
from airflow_resumable.version_compat import Context, DecoratedOperator, KeywordParameters, task_decorator_factory


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
    template_fields: Sequence[str] = ("op_args", "op_kwargs", "job", "restart")
    template_fields_renderers = {"op_args": "py", "op_kwargs": "py"}
    shallow_copy_attrs: Sequence[str] = ("python_callable", "resumable_fn")

    def __init__(self, *, python_callable: Callable[..., Any], op_args: Any = None, op_kwargs: Any = None, **kwargs: Any):
        fn = getattr(python_callable, "__resumable_fn__", None) or python_callable
        stand_in = python_callable if fn is not python_callable else _without_ctx(fn)
        self.resumable_fn = fn
        super().__init__(
            python_callable=stand_in,
            op_args=op_args,
            op_kwargs=op_kwargs,
            kwargs_to_upstream={"handler": fn},
            **kwargs,
        )

    def _handler(self, context: Context) -> Callable[[RunContext], Any]:
        merged = {**context, **self.op_kwargs}
        kwargs = dict(KeywordParameters.determine(self.python_callable, self.op_args, merged).unpacking())
        args = list(self.op_args)
        fn = self.resumable_fn
        return lambda ctx: fn(ctx, *args, **kwargs)


def resumable_task(python_callable: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """Turn ``fn(ctx, ...)`` into a resumable task. Takes :class:`ResumableOperator`'s arguments."""
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=False,
        decorated_operator_class=_ResumableDecoratedOperator,
        **kwargs,
    )
