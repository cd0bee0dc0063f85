"""The operators' arguments, each declared once, and the checks every entry point makes of them.

Each argument is an :class:`Option`: its name, default, doc and parse-time check, written in one
place. An attempt's options are fields of :class:`Options`, declared with :func:`option` (as
:func:`~airflow_resumable.core.model.columns.column` declares a column); the operator's own arguments
are :data:`TASK_OPTIONS`. Everything else derives from them: :func:`problems` (every problem at
once, at DAG parse time where it can), the operator's ``Options(...)`` and attributes, its
docstring's parameter list and the docs' argument table (tests compare the operator's
signature and the docs with :data:`ARGUMENTS`).

Every check returns a sentence naming the argument and what was wrong (or None), so callers can
report all problems at once: :class:`Options` (the core's), ``ResumableOperator`` and
``ChunkedOperator`` (the operators') and the chunk loop use them.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import textwrap
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from airflow_resumable.core.model import defaults
from airflow_resumable.core.model.checkpoint import short
from airflow_resumable.core.model.errors import ConfigurationError

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

#: The default of a required argument: no default (as :mod:`inspect` writes it, so a signature's
#: required parameter equals its declaration).
REQUIRED: Any = inspect.Parameter.empty

#: A parse-time check: ``check(name, value)`` is what is wrong with the value, as a sentence, or None.
Check = Callable[[str, Any], "str | None"]


@dataclasses.dataclass(frozen=True)
class Option:
    """One argument, declared once.

    Attributes:
        name: the keyword argument (and the operator's attribute).
        default: its default (None: optional, and None is never checked; :data:`REQUIRED`: none,
            and None is checked like any value).
        doc: what it does, in Markdown (one line: the docs' table and the docstring).
        check: the parse-time check (None: none here; ``handler_kwargs``, which may be an XCom, is
            checked by the operator).
        seconds: a duration: seconds, or a ``timedelta`` taken as seconds.
        templated: rendered by Airflow's templating (one of the operator's ``template_fields``).
        shown: the docs' default, where the value alone does not say it.
        more: what the docstring adds to ``doc``.
    """

    name: str
    default: Any
    doc: str
    check: Check | None = None
    seconds: bool = False
    templated: bool = False
    shown: str | None = None
    more: str = ""

    def take(self, value: Any) -> Any:
        """The value as stored: a duration's ``timedelta`` as seconds, anything else as given."""
        if self.seconds and isinstance(value, timedelta):
            return value.total_seconds()
        return value

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` for this option, as a sentence, or None."""
        if self.check is None or (value is None and self.default is None):
            return None
        return self.check(self.name, value)

    def row(self) -> str:
        """The option's row of the docs' argument table."""
        if self.shown is not None:
            default = self.shown
        elif self.default is REQUIRED:
            default = "required"
        elif isinstance(self.default, str):
            default = f'`"{self.default}"`'
        else:
            default = f"`{self.default:g}`" if isinstance(self.default, float) else f"`{self.default}`"
        cell = (self.doc + (" (templated)" if self.templated else "")).replace("|", r"\|")  # a | inside a cell
        return f"| `{self.name}` | {default} | {cell} |"

    def text(self) -> str:
        """The option's doc for a docstring: ``doc`` and ``more``."""
        return " ".join(part for part in (self.doc + (" (templated)." if self.templated else "."), self.more) if part)

    def param(self) -> str:
        """The option's ``:param:`` entry for a docstring (reStructuredText)."""
        return f":param {self.name}: {_rst(self.text())}"


def option(
    default: Any, doc: str, *, check: Check | None = None, seconds: bool = False, shown: str | None = None,
    more: str = "",
) -> Any:
    """A dataclass field of :class:`Options` that is also an operator argument (see :class:`Option`)."""
    spec = {"doc": doc, "check": check, "seconds": seconds, "shown": shown, "more": more}
    return dataclasses.field(default=default, metadata={"option": spec})


def declared(cls: type) -> tuple[Option, ...]:
    """The options declared as fields of the dataclass ``cls`` with :func:`option`, in order."""
    return tuple(
        Option(f.name, f.default, **f.metadata["option"]) for f in dataclasses.fields(cls) if "option" in f.metadata
    )


def problems(options: Iterable[Option], values: Mapping[str, Any]) -> list[str]:
    """Every problem with ``values`` (keyed by option name; absent ones are not checked), as sentences."""
    return [p for o in options if o.name in values and (p := o.problem(values[o.name]))]


def signature_text(options: Iterable[Option]) -> str:
    """The keyword-only parameters as a signature shows them: ``*, read, chunk_size, skip_limit=10``."""
    return ", ".join(["*", *(o.name if o.default is REQUIRED else f"{o.name}={o.default!r}" for o in options)])


def markdown(options: Iterable[Option]) -> str:
    """The docs' argument table (docs/reference/operators.md)."""
    return "\n".join(["| argument | default | meaning |", "|---|---|---|", *(o.row() for o in options)])


def params_doc(options: Iterable[Option], indent: str = "    ", style: str = "rst") -> str:
    """A docstring's list of the options: ``:param name: ...`` (``rst``) or ``name: ...`` (``google``)."""
    return "\n".join(
        textwrap.fill(o.param() if style == "rst" else f"{o.name}: {_rst(o.text())}", width=100,
                      initial_indent=indent, subsequent_indent=indent + "    ")
        for o in options
    )


def _rst(markdown_text: str) -> str:
    """Markdown's inline code (```x```) as reStructuredText's (````x````)."""
    return re.sub(r"`([^`]+)`", r"``\1``", markdown_text)


# -- checks ------------------------------------------------------------------------------------


def seconds(*, positive: bool = False, minimum: float = 0.0, maximum: float = MAX_SECONDS, why: str = "") -> Check:
    """The check of a duration (see :func:`duration_problem`)."""
    return lambda name, value: duration_problem(name, value, positive=positive, minimum=minimum, maximum=maximum,
                                                why=why)


def one_of(choices: Sequence[str]) -> Check:
    """The check of a value that must be one of ``choices``."""
    def check(name: str, value: Any) -> str | None:
        return None if value in choices else f"{name} must be one of {', '.join(choices)}, got {value!r}"

    return check


def flag(name: str, value: Any) -> str | None:
    """The check of a True/False option."""
    return None if isinstance(value, bool) else f"{name} must be True or False, got {value!r}"


def function(name: str, value: Any) -> str | None:
    """The check of a handler: something to call as ``handler(ctx)`` (how, the operator checks)."""
    return None if callable(value) else f"{name} must be callable as {name}(ctx), got {type(value).__name__}"


def function_of_ctx(name: str, value: Any) -> str | None:
    """The check of an ``fn(ctx)`` option (the throttle)."""
    if not callable(value):
        return f"{name} must be a function fn(ctx) -> seconds or None, got {type(value).__name__}"
    return call_problem(value, name, ("ctx",), ())


def function_of_ctx_item(name: str, value: Any) -> str | None:
    """The check of an ``fn(ctx, item)`` option (the replay of a skipped item)."""
    if value is None:
        return None
    if not callable(value):
        return f"{name} must be a function fn(ctx, item), got {type(value).__name__}"
    return call_problem(value, name, ("ctx", "item"), ())


def connection_id(name: str, value: Any) -> str | None:
    """The check of an Airflow connection id."""
    return None if isinstance(value, str) and value else f"{name} must be a connection id, got {value!r}"


def job_name(name: str, value: Any) -> str | None:
    """The check of a job name; a template (``{{ ... }}``) is checked once rendered, when the task runs."""
    if isinstance(value, str) and not templated(value):
        return key_problem(name, value)
    return None


def templated(text: str) -> bool:
    """Whether ``text`` is a Jinja template (rendered by Airflow before the task runs)."""
    return "{{" in text or "{%" in text


def _policies() -> str:
    return ", ".join(f'`"{p}"`' for p in OVERLAP_POLICIES)


@dataclasses.dataclass(frozen=True)
class Options:
    """How an attempt behaves. Validated on construction, so bad values fail at DAG parse time.

    ``restart`` discards an unfinished checkpoint and starts over, on purpose (the operator sets it
    from its own ``restart`` and the run's conf on the run's first try). Every other field is an
    :class:`Option`, listed below from its declaration. Construction raises
    :class:`~airflow_resumable.core.model.errors.ConfigurationError` naming every option that is wrong.
    """

    timeout: float | None = option(
        None, "cooperative timeout per attempt, in seconds: the signal fires with reason `timeout`",
        check=seconds(positive=True), seconds=True,
        more="The handler stops at its next chunk boundary, the attempt fails and is retried from the checkpoint. "
             "When `execution_timeout` is not set, the operator sets it to `timeout + timeout_grace` as a backstop.",
    )
    lease: float = option(
        defaults.LEASE,
        f"seconds a lease lasts without renewal ({MIN_LEASE:g} to {MAX_LEASE:g}, one day); renewed every `lease / 3`",
        check=seconds(minimum=MIN_LEASE, maximum=MAX_LEASE, why=" (it is renewed every lease/3)"), seconds=True,
    )
    lease_wait: float | None = option(
        None, "seconds to wait for another live attempt of the slot", check=seconds(), seconds=True,
        shown="one lease + one heartbeat",
        more="None: one lease and one heartbeat, enough for a dead holder's lease to lapse.",
    )
    overlap: str = option(
        defaults.OVERLAP, f"{_policies()}: what a run does when another slot of the same job is still live",
        check=one_of(OVERLAP_POLICIES),
    )
    restart: bool = False
    progress_interval: float = option(
        defaults.PROGRESS_INTERVAL, "seconds between progress lines in the task log", check=seconds(), seconds=True,
    )
    throttle: Callable[..., Any] | None = option(
        None, "`fn(ctx) -> seconds | timedelta | None`, asked after every checkpoint: a wait before the next chunk",
        check=function_of_ctx,
        more="None or 0: no wait. A wait shorter than `defer_after` sleeps on the run's signal (a cancel still stops "
             "it at once); a longer one pauses the task (reason `throttled`): it defers, holding no worker slot, and "
             "continues in the same try when the time comes.",
    )
    max_runtime: float | None = option(
        None, "seconds to run in one go before deferring for an instant (a time slice)",
        check=seconds(positive=True), seconds=True,
        more="The task checkpoints and pauses (reason `time_slice`), giving its worker slot back to the queue "
             "(pools, other DAGs), then continues in the same try. None: no limit.",
    )
    defer_after: float = option(
        defaults.DEFER_AFTER, "a throttle wait this long or longer defers instead of sleeping", check=seconds(),
        seconds=True,
    )
    pipeline_checkpoints: bool = option(
        defaults.PIPELINE_CHECKPOINTS,
        "write each checkpoint on a second connection while the next chunk runs (one write in flight): the "
        "checkpoint leaves the loop, a crash repeats up to two chunks; refused with `ctx.transaction()`",
        check=flag,
    )

    def __post_init__(self) -> None:
        found = problems(ATTEMPT_OPTIONS, vars(self))
        if found:
            raise ConfigurationError("; ".join(found))

    @property
    def effective_lease_wait(self) -> float:
        return self.lease_wait if self.lease_wait is not None else self.lease + heartbeat_interval(self.lease)


#: The operator's own arguments: what a task is (handler, store, job) and how the operator waits,
#: reports and defers. Their values never reach the core's :class:`Options`.
TASK_OPTIONS: tuple[Option, ...] = (
    Option("handler", None, "`fn(ctx)` (or `fn(ctx, **handler_kwargs)`) owning its loop", check=function,
           shown="required"),
    Option("conn_id", defaults.CONN_ID, "Airflow connection of the checkpoint store (`sqlite` or `postgres`)",
           check=connection_id),
    Option("job", None, "the job's name; a mapped task instance always adds `[map_index]`", check=job_name,
           templated=True, shown="`<dag_id>.<task_id>`",
           more="Whatever `job` says: one checkpoint per partition. Two tasks with the same job share checkpoints "
                "and the overlap policy: the slot one of them finished is not run again by the other."),
    Option("restart", False,
           'start the slot over on the run\'s first try, on purpose: a bool or `"true"`/`"false"`, e.g. '
           '`"{{ params.restart }}"`', templated=True,
           more="An unfinished checkpoint is discarded and a finished slot runs again. Retries and Clears resume "
                "as usual."),
    Option("timeout_grace", defaults.TIMEOUT_GRACE, "seconds between `timeout` and the `execution_timeout` backstop",
           check=seconds(), seconds=True),
    Option("overlap_poke", defaults.OVERLAP_POKE, 'seconds between checks while `overlap="wait"`',
           check=seconds(positive=True), seconds=True),
    Option("overlap_timeout", defaults.OVERLAP_TIMEOUT, 'seconds `overlap="wait"` waits in all before failing the attempt',
           check=seconds(), seconds=True),
    Option("xcom_interval", defaults.XCOM_INTERVAL, "seconds between XCom pushes of the row", check=seconds(),
           seconds=True),
    Option("pause_timeout", None, "seconds a paused task waits for its resume before Airflow fails it",
           check=seconds(positive=True), seconds=True,
           more="A paused task is one paused by `airflow_resumable.control.pause`; Airflow fails it with "
                "`TaskDeferralTimeout` (its retries apply). None: no limit."),
    Option("resume_poll", defaults.RESUME_POLL, "seconds between the paused task's reads of its row, in the triggerer",
           check=seconds(minimum=0.1, maximum=3600.0), seconds=True),
    Option("handler_kwargs", None,
           "keyword arguments for the handler (`read`/`process` for `ChunkedOperator`); `.expand()` them for mapped "
           "tasks", templated=True, shown="`{}`"),
    Option("replay", None, "`fn(ctx, item)`: retries one skipped item whose retry was requested, before the handler "
           "runs (`ChunkedOperator` uses `process`)", check=function_of_ctx_item,
           more="A handler that records skips with `ctx.skip()` gives it so that `airflow resumable skipped retry` "
                "(or the Checkpoint tab's retry) can replay them; without it they stay skipped, saying why."),
)

#: The options of an attempt: the fields of :class:`Options` declared with :func:`option`.
ATTEMPT_OPTIONS: tuple[Option, ...] = declared(Options)

#: Every argument the operators declare, by name: the operator's own and the attempt's.
ARGUMENTS: Mapping[str, Option] = {o.name: o for o in (*TASK_OPTIONS, *ATTEMPT_OPTIONS)}

Options.__doc__ = f"{Options.__doc__}\n    Attributes:\n{params_doc(ATTEMPT_OPTIONS, indent='        ', style='google')}\n"


def validate_options(**values: Any) -> list[str]:
    """Every problem with these :class:`Options` values, as sentences (empty when they are fine)."""
    return problems(ATTEMPT_OPTIONS, values)


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


def key_problem(name: str, value: Any, *, size: bool = True) -> str | None:
    """What keeps a job or slot name out of the checkpoint table, as a sentence, or None. Without
    ``size``, only what no query can carry (a lookup of a name too long to be stored finds nothing)."""
    if not value or not isinstance(value, str):
        return f"{name} must be a non-empty string, got {value!r}"
    if "\x00" in value:
        return f"{name} {short(value, 60)} contains a NUL character, which the database cannot store"
    try:
        n = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return f"{name} {short(value, 60)} cannot be stored as UTF-8 ({exc.reason})"
    if size and n > MAX_KEY_BYTES:
        return f"{name} is {n} bytes long in UTF-8, over the {MAX_KEY_BYTES} the checkpoint table's key allows"
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


def heartbeat_interval(lease_seconds: float) -> float:
    """Renew three times per lease: two renewals may fail before the lease can expire."""
    return lease_seconds / 3.0
