"""An attempt's options and the checks every entry point makes of its arguments.

Every check returns a sentence naming the argument and what was wrong (or None), so callers can
report all problems at once, at DAG parse time where they can: :class:`Options` (the core's),
``ResumableOperator`` and ``ChunkedOperator`` (the operators') and the chunk loop use them.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Collection, Sequence
from datetime import timedelta
from typing import Any

from airflow_resumable.core import defaults
from airflow_resumable.core.checkpoint import short
from airflow_resumable.core.errors import ConfigurationError
from airflow_resumable.core.lease import heartbeat_interval

OVERLAP_POLICIES = ("skip", "allow", "wait", "replace")

#: The shortest lease that leaves its heartbeats room (three renewals per lease).
MIN_LEASE = 0.3

#: The longest lease: one day. A crashed holder blocks its slot for at most this long, and
#: ``now + lease`` stays inside what both databases' time arithmetic and Python's datetime can hold.
MAX_LEASE = 86400.0

#: The longest any other duration may be (timeouts, waits, intervals): one year. Far beyond any
#: sensible setting, and far inside ``timedelta`` and the databases' time ranges.
MAX_SECONDS = 366 * 86400.0

#: The longest job or slot name, in UTF-8 bytes. Both go into the checkpoint table's primary key,
#: and PostgreSQL cannot index a key over about 2,700 bytes: two names of 1,024 bytes fit.
MAX_KEY_BYTES = 1024


@dataclasses.dataclass(frozen=True)
class Options:
    """How an attempt behaves. Validated on construction, so bad values fail at DAG parse time.

    Attributes:
        timeout: seconds after which the signal fires with reason ``timeout`` (None: never).
        lease: seconds a lease lasts without renewal; renewed every ``lease / 3``.
        lease_wait: how long to wait for another live attempt's lease before giving up
            (None: one lease duration plus one heartbeat, enough for a dead holder's lease to lapse).
        overlap: ``skip``, ``allow``, ``wait`` or ``replace`` (between slots of the same job).
        restart: discard an unfinished checkpoint and start over, on purpose.
        progress_interval: seconds between progress log lines.
        throttle: ``fn(ctx) -> seconds | timedelta | None``, asked after every checkpoint: a wait
            before the next chunk (None or 0: none). A wait of ``defer_after`` or more pauses the
            run (reason ``throttled``) until then; a shorter one sleeps on the signal.
        max_runtime: seconds the attempt runs in one go before it pauses (reason ``time_slice``)
            to give its worker back for a moment (None: no limit).
        defer_after: the throttle wait from which the run pauses instead of sleeping.
        pipeline_checkpoints: write each checkpoint while the next chunk runs (one write in
            flight; a crash then repeats up to two chunks). Not with ``ctx.transaction()``.
    """

    timeout: float | None = None
    lease: float = defaults.LEASE
    lease_wait: float | None = None
    overlap: str = defaults.OVERLAP
    restart: bool = False
    progress_interval: float = defaults.PROGRESS_INTERVAL
    throttle: Callable[..., Any] | None = None
    max_runtime: float | None = None
    defer_after: float = defaults.DEFER_AFTER
    pipeline_checkpoints: bool = defaults.PIPELINE_CHECKPOINTS

    def __post_init__(self) -> None:
        problems = validate_options(
            timeout=self.timeout, lease=self.lease, lease_wait=self.lease_wait, overlap=self.overlap,
            progress_interval=self.progress_interval, throttle=self.throttle, max_runtime=self.max_runtime,
            defer_after=self.defer_after, pipeline_checkpoints=self.pipeline_checkpoints,
        )
        if problems:
            raise ConfigurationError("; ".join(problems))

    @property
    def effective_lease_wait(self) -> float:
        return self.lease_wait if self.lease_wait is not None else self.lease + heartbeat_interval(self.lease)


def validate_options(
    *, timeout: Any, lease: Any, lease_wait: Any, overlap: Any, progress_interval: Any = 0, throttle: Any = None,
    max_runtime: Any = None, defer_after: Any = defaults.DEFER_AFTER, pipeline_checkpoints: Any = False,
) -> list[str]:
    """Every problem with these options, as sentences (empty when they are fine)."""
    problems = [
        p for p in (
            None if timeout is None else duration_problem("timeout", timeout, positive=True),
            duration_problem(
                "lease", lease, minimum=MIN_LEASE, maximum=MAX_LEASE, why=" (it is renewed every lease/3)"
            ),
            None if lease_wait is None else duration_problem("lease_wait", lease_wait),
        ) if p
    ]
    if overlap not in OVERLAP_POLICIES:
        problems.append(f"overlap must be one of {', '.join(OVERLAP_POLICIES)}, got {overlap!r}")
    problems += [
        p for p in (
            duration_problem("progress_interval", progress_interval),
            None if max_runtime is None else duration_problem("max_runtime", max_runtime, positive=True),
            duration_problem("defer_after", defer_after),
        ) if p
    ]
    if throttle is not None:
        if not callable(throttle):
            problems.append(f"throttle must be a function fn(ctx) -> seconds or None, got {type(throttle).__name__}")
        else:
            problem = call_problem(throttle, "throttle", ("ctx",), ())
            if problem:
                problems.append(problem)
    if not isinstance(pipeline_checkpoints, bool):
        problems.append(f"pipeline_checkpoints must be True or False, got {pipeline_checkpoints!r}")
    return problems


def wait_seconds(value: Any) -> float | None:
    """A throttle's answer as seconds (None: no wait), or raise ValueError saying what was wrong."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    problem = duration_problem("the wait", value)
    if problem:
        raise ValueError(problem)
    return float(value) or None


def duration_problem(
    name: str, value: Any, *, positive: bool = False, minimum: float = 0.0, maximum: float = MAX_SECONDS,
    why: str = "",
) -> str | None:
    """What is wrong with a number of seconds, as a sentence, or None when it is fine.

    NaN and infinity are refused: NaN compares false with everything, so it slips past range
    checks, and neither can become a ``timedelta``, a deadline or a timestamp in the database.
    """
    if _number(value) and math.isfinite(value) and minimum <= value <= maximum and not (positive and value == 0):
        return None
    limit = f"at most {maximum:g} ({_span(maximum)})"
    if minimum > 0:
        what = f"at least {minimum:g} seconds{why} and {limit}"
    else:
        what = f"a {'positive' if positive else 'non-negative'} number of seconds{why}, finite and {limit}"
    return f"{name} must be {what}, got {value!r}"


def key_problem(name: str, value: Any) -> str | None:
    """What keeps a job or slot name out of the checkpoint table, as a sentence, or None."""
    if not value or not isinstance(value, str):
        return f"{name} must be a non-empty string, got {value!r}"
    if "\x00" in value:
        return f"{name} {short(value, 60)} contains a NUL character, which the database cannot store"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return f"{name} {short(value, 60)} cannot be stored as UTF-8 ({exc.reason})"
    if size > MAX_KEY_BYTES:
        return f"{name} is {size} bytes long in UTF-8, over the {MAX_KEY_BYTES} the checkpoint table's key allows"
    return None


def call_problem(fn: Any, name: str, params: Sequence[str], keywords: Collection[str] | None) -> str | None:
    """Why ``fn`` cannot take the call ``name(*params, **keywords)``, as a sentence, or None.

    ``keywords`` None means they are not known yet (mapped or XCom handler_kwargs): only the
    positional part is checked then. Callables without a signature (some builtins) are not checked.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        if keywords is None:
            signature.bind_partial(*params)
        else:
            signature.bind(*params, **dict.fromkeys(keywords))
    except TypeError as exc:
        shown = ", ".join([*params, *(f"{k}=..." for k in keywords or ())] + ([] if keywords is not None else ["..."]))
        label = getattr(fn, "__qualname__", None) or type(fn).__name__
        callee = name if name.isidentifier() else label
        return f"{name} {label}{signature} cannot be called as {callee}({shown}): {exc}"
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _span(seconds: float) -> str:
    return "one day" if seconds == 86400 else ("one year" if seconds == MAX_SECONDS else f"{seconds:g}s")
