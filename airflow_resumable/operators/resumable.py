"""Operators that run chunked handlers from their last checkpoint.

``ResumableOperator`` runs a handler that owns its loop (``handler(ctx)``); ``ChunkedOperator``
owns the loop and calls ``read``/``process``. Both run the core's single attempt loop
(:class:`airflow_resumable.core.attempt.runner.Attempt`); this module only wires it to Airflow: the
task instance in the core's terms (:mod:`~airflow_resumable.operators.task_instance`), reporting
(:mod:`~airflow_resumable.operators.reporting`), the argument checks
(:mod:`~airflow_resumable.operators.checks`), pausing as deferral, and outcomes through
:mod:`airflow_resumable.operators.outcome`.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, NoReturn

from airflow_resumable.core.attempt.async_bridge import SyncCalls
from airflow_resumable.core.attempt.context import RunContext
from airflow_resumable.core.attempt.runner import Attempt, Hooks, Outcome
from airflow_resumable.core.attempt.signal import Reason
from airflow_resumable.core.model import defaults
from airflow_resumable.core.model.errors import (
    Cancelled,
    ConfigurationError,
    LeaseLost,
    OverlapSkip,
    OverlapWait,
    Paused,
    ReaderChanged,
)
from airflow_resumable.core.model.observe import Source
from airflow_resumable.core.model.options import ARGUMENTS, ATTEMPT_OPTIONS, Option, Options, call_problem, params_doc
from airflow_resumable.core.model.options import problems as option_problems
from airflow_resumable.core.model.outward import outward_text
from airflow_resumable.core.readers import Reader
from airflow_resumable.core.stores import Store
from airflow_resumable.core.view import task_summary
from airflow_resumable.core.work.chunk_loop import CHUNKED_OPTIONS, calls_problems, chunk_loop, chunked_problems
from airflow_resumable.hooks.resumable import DEFAULT_CONN_ID, ResumableHook
from airflow_resumable.metrics import Metrics
from airflow_resumable.operators import task_instance
from airflow_resumable.operators.checks import configuration_error, parse_time_problems, run_time_problems
from airflow_resumable.operators.confirm import confirm_on_success
from airflow_resumable.operators.lineage import OpenLineageMethods
from airflow_resumable.operators.outcome import CombinedRetryPolicy, ResumableStopped, to_airflow
from airflow_resumable.operators.overlap import report_overlap
from airflow_resumable.operators.reporting import XCOM_KEY, XCOM_ROW_LIMIT, AirflowReporter
from airflow_resumable.operators.state_store import StateStoreMirror
from airflow_resumable.operators.task_instance import RESTART_CONF_KEY, slot_of
from airflow_resumable.operators.tracing import AttemptTrace, attempt_span
from airflow_resumable.triggers.resume import SlotResumeTrigger
from airflow_resumable.version_compat import (
    AirflowException,
    AirflowFailException,
    AirflowRescheduleException,
    BaseOperator,
    Context,
    built_from_mapped,
    conf,
    needs,
    serde_deserialize,
    serde_serialize,
    supports,
)

# Their import paths from before the split, kept.
__all__ = [
    "OPERATOR_ARGUMENTS", "RESTART_CONF_KEY", "XCOM_KEY", "XCOM_ROW_LIMIT", "AirflowReporter", "ChunkedOperator",
    "ResumableOperator", "resume_settle", "slot_of",
]


class ResumableOperator(OpenLineageMethods, BaseOperator):
    """Run ``handler(ctx)`` so that a retry or a Clear continues from its last checkpoint.

    The handler owns its loop: it reads ``ctx.position`` (None on a fresh start), does a chunk,
    calls ``ctx.checkpoint(position, ...)``, and repeats. ``checkpoint()`` saves durably, reports
    progress, then raises :class:`~airflow_resumable.core.model.errors.Cancelled` if the run was asked
    to stop. Returning means the work is done.

    Durations are seconds or a ``timedelta``. The parameters, from their declarations
    (:data:`airflow_resumable.core.model.options.ARGUMENTS`):

    """

    template_fields: Sequence[str] = tuple(a.name for a in ARGUMENTS.values() if a.templated)
    template_fields_renderers = {"handler_kwargs": "json"}
    ui_color = "#e8f4ea"

    # The arguments as stored (a duration as seconds), set in __init__ one line each:
    # the types of those this class reads itself (the rest reach the core through Options).
    handler: Callable[..., Any] | None
    conn_id: str
    job: str | None
    restart: bool | str
    handler_kwargs: Any  # a dict, or an XCom that rendering turns into one
    replay: Callable[..., Any] | None
    timeout: float | None
    timeout_grace: float
    overlap_poke: float
    overlap_timeout: float
    xcom_interval: float
    pause_timeout: float | None
    resume_poll: float

    def __init__(
        self,
        *,
        handler: Callable[..., Any] | None = None,
        conn_id: str = DEFAULT_CONN_ID,
        job: str | None = None,
        restart: bool | str = False,
        timeout: float | timedelta | None = None,
        timeout_grace: float | timedelta = defaults.TIMEOUT_GRACE,
        lease: float | timedelta = defaults.LEASE,
        lease_wait: float | timedelta | None = None,
        overlap: str = defaults.OVERLAP,
        overlap_poke: float | timedelta = defaults.OVERLAP_POKE,
        overlap_timeout: float | timedelta = defaults.OVERLAP_TIMEOUT,
        progress_interval: float | timedelta = defaults.PROGRESS_INTERVAL,
        xcom_interval: float | timedelta = defaults.XCOM_INTERVAL,
        throttle: Callable[[RunContext], Any] | None = None,
        defer_after: float | timedelta = defaults.DEFER_AFTER,
        max_runtime: float | timedelta | None = None,
        pause_timeout: float | timedelta | None = None,
        resume_poll: float | timedelta = defaults.RESUME_POLL,
        pipeline_checkpoints: bool = defaults.PIPELINE_CHECKPOINTS,
        handler_kwargs: Mapping[str, Any] | None = None,
        replay: Callable[..., Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("retry_policy") is not None and not supports("retry_policy="):
            # Airflow before 3.3 would refuse it as an unknown argument, without saying why.
            raise configuration_error(str(kwargs.get("task_id")), [needs("retry_policy=")],
                                      hint="Nothing was run or written")
        super().__init__(**kwargs)
        # Stored as given, a duration as seconds (each declared argument has its line: a test checks).
        self.handler = handler
        self.conn_id = conn_id
        self.job = job
        self.restart = restart
        self.timeout = _seconds(timeout)
        self.timeout_grace = _seconds(timeout_grace)
        self.lease = _seconds(lease)
        self.lease_wait = _seconds(lease_wait)
        self.overlap = overlap
        self.overlap_poke = _seconds(overlap_poke)
        self.overlap_timeout = _seconds(overlap_timeout)
        self.progress_interval = _seconds(progress_interval)
        self.xcom_interval = _seconds(xcom_interval)
        self.throttle = throttle
        self.defer_after = _seconds(defer_after)
        self.max_runtime = _seconds(max_runtime)
        self.pause_timeout = _seconds(pause_timeout)
        self.resume_poll = _seconds(resume_poll)
        self.pipeline_checkpoints = pipeline_checkpoints
        self.handler_kwargs = handler_kwargs
        self.replay = replay
        # An XCom (handler_kwargs=upstream_task()) is kept as it is: rendering resolves it to a dict.
        if handler_kwargs is None or isinstance(handler_kwargs, Mapping):
            self.handler_kwargs = dict(handler_kwargs or {})
        self._attempt: Attempt | None = None
        self._trace: AttemptTrace | None = None
        self._terminated = False
        #: Problems found while a mapped task instance was being built on the worker: raised by
        #: execute(), where they fail the task without spending a retry.
        self._deferred: ConfigurationError | None = None
        self._validate()
        if self.timeout is not None and self.execution_timeout is None and self._deferred is None:
            self.execution_timeout = timedelta(seconds=self.timeout + self.timeout_grace)

    # -- validation at parse time --------------------------------------------------------------

    def _validate(self) -> None:
        problems = option_problems(OPERATOR_ARGUMENTS, {a.name: getattr(self, a.name) for a in OPERATOR_ARGUMENTS})
        problems += self._own_problems()
        if self.handler is None and type(self)._handler is ResumableOperator._handler:
            problems.append("handler is required: ResumableOperator(handler=fn), where def fn(ctx): ...")
        problems += parse_time_problems(self.handler_kwargs, lambda keywords: self._call_problems(keywords, None))
        if problems:
            error = configuration_error(self.task_id, problems, hint="Fix the operator's arguments")
            if built_from_mapped(self):
                # A mapped task instance is built on the worker, outside execute(): an error here
                # would spend a retry. execute() raises it instead.
                self._deferred = error
                return
            raise error

    def _own_problems(self) -> list[str]:
        """Problems with a subclass's own arguments, reported with the others."""
        return []

    def _call_problems(self, keywords: Collection[str] | None, context: Context | None) -> list[str]:
        """Why the user's functions cannot take the calls this task makes, as sentences.

        ``keywords`` are the names in ``handler_kwargs`` (None: not known yet, only the positional
        part is checked); ``context`` is None at parse time and the task's context in execute().
        """
        if type(self)._handler is not ResumableOperator._handler or not callable(self.handler):
            return []
        problem = call_problem(self.handler, "handler", ("ctx",), keywords)
        return [problem] if problem else []

    def _check_calls(self, context: Context, job: str, slot: str) -> None:
        """At the start of execute(), before any row is touched: the arguments as rendered
        (mapped or XCom ``handler_kwargs``) against the functions that will take them.

        Raises:
            ConfigurationError: naming the task, the job and the slot.
        """
        if self._deferred is not None:
            raise ConfigurationError(self._deferred.message, job=job, slot=slot, hint=self._deferred.hint)
        problems = run_time_problems(self.handler_kwargs, lambda keywords: self._call_problems(keywords, context))
        if problems:
            raise configuration_error(
                self.task_id, problems, job=job, slot=slot,
                hint="Change the function's signature or the task's handler_kwargs; nothing was run or written",
            )

    # -- what subclasses change ----------------------------------------------------------------

    def _handler(self, context: Context) -> Callable[[RunContext], Any]:
        handler, kwargs, replay = self.handler, self.handler_kwargs, self.replay
        assert handler is not None

        def run(ctx: RunContext) -> Any:
            # Skipped items whose retry was requested go first (none: nothing happens); an async
            # replay runs on an event loop of its own. An async handler gives back its coroutine:
            # the attempt drives it.
            with SyncCalls(ctx.signal, ctx.log, job=ctx.job, slot=ctx.slot) as calls:
                ctx.replay_skipped(None if replay is None else lambda item: calls.sync(replay)(ctx, item))
            return handler(ctx, **kwargs) if kwargs else handler(ctx)

        return run

    # -- execution -----------------------------------------------------------------------------

    def job_name(self, context: Context) -> str:
        """``job`` (default ``<dag_id>.<task_id>``), plus ``[map_index]`` for a mapped task instance:
        partitions never share a checkpoint, even under a shared ``job``."""
        return task_instance.job_name(self.job, context["ti"], dag_id=self.dag_id, task_id=self.task_id)

    def execute(self, context: Context) -> Any:
        with attempt_span(self, context) as self._trace:
            return self._run(context, ran=0.0, first=True)

    def execute_resumed(self, context: Context, event: Mapping[str, Any] | None = None, ran: float = 0.0) -> Any:
        """Where a paused task continues, in the same try, when its trigger fires."""
        job = self.job_name(context)
        slot, _ = slot_of(context)
        event = dict(event or {"event": "resumed", "why": "the trigger fired"})
        why = outward_text(str(event.get("why", "")))  # sanitized by the trigger; an event is data, read again
        where = outward_text(f"[job={job!r} slot={slot!r}]")
        if event.get("event") == "cancelled":
            raise ResumableStopped(f"{why}: the checkpoint is kept {where}. Not retried: Clear this task to resume it")
        if event.get("event") == "missing":
            raise AirflowFailException(f"{why} {where}; a Clear starts the slot over")
        self.log.info("continuing in the same try: %s %s", why, where)
        with attempt_span(self, context) as self._trace:
            return self._run(context, ran=float(event.get("ran", ran)), first=False)

    def _run(self, context: Context, *, ran: float, first: bool) -> Any:
        """One execution of the task: ``execute()`` and each continuation after a pause. ``ran``
        is how long the try ran before (the cooperative ``timeout`` counts running time only)."""
        began = time.monotonic()
        self._observed = None
        ti = context["ti"]
        job = self.job_name(context)
        identity = task_instance.identity(context, job)
        slot, origin = identity.slot, identity.origin
        try:
            self._check_calls(context, job, slot)
        except ConfigurationError as exc:
            raise (self._to_airflow(exc, context, job, slot) or exc) from exc
        paused: Paused | None = None
        outcome: Outcome | None = None
        options = Options(**{
            **{o.name: getattr(self, o.name) for o in ATTEMPT_OPTIONS},
            # The cooperative timeout counts this try's running time only: what is left of it.
            "timeout": None if self.timeout is None else max(self.timeout - ran, 0.001),
            "restart": first and task_instance.restart_requested(
                context, restart=self.restart, task_id=self.task_id, job=self.job, job_name=job),
        })
        try:
            store = ResumableHook(self.conn_id, job=job, slot=slot).get_store()
            self.log.info("checkpoints in %s [job=%s slot=%s attempt=%s]", store.describe(), job, slot, ti.try_number)
            attempt = Attempt(
                store,
                identity,
                hooks=Hooks(resolve_reason=task_instance.classify(context),
                            rerun=task_instance.rerun(context, origin, retries=self.retries or 0),
                            result_codec=(serde_serialize, serde_deserialize)),
                options=options,
                reporter=AirflowReporter(
                    self.log, ti, interval=options.progress_interval, xcom_interval=self.xcom_interval,
                    where=store.describe(),
                    mirror=StateStoreMirror(self.log, ti, context.get("task_state_store")), trace=self._trace,
                ),
                log=self.log,
            )
            self._attempt = attempt
            if self._terminated:  # SIGTERM came while the store was being opened
                attempt.signal.cancel(Reason.TERMINATED, "the task process received SIGTERM")
            kept = confirm_on_success(self, store, job, slot, origin, more=self._confirms_more())
            attempt.keep_session = True  # the confirmation below writes on it instead of connecting again
            outcome = attempt.run(self._handler(context))
            kept.give(attempt.kept_session)
        except Paused as exc:
            paused = exc
        except OverlapWait as exc:
            report_overlap(self.log, ti, "wait", exc)
            raise self._wait_or_give_up(context, exc) from exc
        except OverlapSkip as exc:
            report_overlap(self.log, ti, "skip", exc)
            raise (self._to_airflow(exc, context, job, slot) or exc) from exc
        except BaseException as exc:
            if _lease_lost(exc):
                Metrics(dag_id=ti.dag_id, task_id=ti.task_id).lease_lost()
            mapped = self._to_airflow(exc, context, job, slot)
            if mapped is None:
                raise
            raise mapped from exc
        finally:
            if self._attempt is not None:  # plain facts for lineage and tracing (memory only)
                self._observed = self._observe(self._attempt.facts(), context)
            self._name_datasets(self._observed)
            self._attempt = None
            self._terminated = False
        if paused is not None:
            self._defer(job, slot, paused, ran + time.monotonic() - began)  # raises TaskDeferred
        assert outcome is not None
        if outcome.result is not None:
            return outcome.result
        return self._summary(outcome, store, job, slot)

    def _confirms_more(self) -> bool:
        """Whether this run is of one more slot after another in the same execution, whose success
        callback must stay (see :func:`confirm_on_success`)."""
        return False

    def _to_airflow(self, exc: BaseException, context: Context, job: str, slot: str) -> BaseException | None:
        """The Airflow exception for ``exc`` (None: raise it unchanged), combining the outcome
        table with the task's ``retry_policy`` (see :mod:`airflow_resumable.operators.outcome`)."""
        policy = getattr(self, "retry_policy", None)  # Airflow 3.3 and later
        if policy is not None and not isinstance(policy, CombinedRetryPolicy):
            # Airflow asks the task's policy once execute() raised: it must see the decision taken
            # here, not judge our Airflow exception afresh.
            self.retry_policy = policy = CombinedRetryPolicy(policy)
        ti = context["ti"]
        return to_airflow(exc, job=job, slot=slot, policy=None if policy is None else policy.policy,
                          try_number=ti.try_number, max_tries=getattr(ti, "max_tries", 0) or 0, context=context)

    def _summary(self, outcome: Outcome, store: Store, job: str, slot: str) -> dict[str, Any]:
        """The task's return value when the handler returns None: the row's figures."""
        return outcome.summary()

    def _defer(self, job: str, slot: str, paused: Paused, ran: float) -> NoReturn:
        """Give the worker back until the slot resumes: Airflow's ``deferred`` state (no worker
        slot, no retry used), waiting on :class:`SlotResumeTrigger` in the triggerer."""
        until = None if paused.until is None else paused.until.isoformat()
        timeout = self.pause_timeout if paused.until is None else None
        self.log.info(
            "deferring (%s): the task holds no worker slot until %s [job=%s slot=%s]", outward_text(paused.reason),
            "it is resumed (airflow_resumable.control.resume)" if until is None else until, outward_text(job),
            outward_text(slot),
        )
        self.defer(
            trigger=SlotResumeTrigger(conn_id=self.conn_id, job=job, slot=slot, until=until, poll=self.resume_poll,
                                      ran=ran, settle=resume_settle()),
            method_name="execute_resumed",
            kwargs=self._resume_kwargs(ran),
            timeout=None if timeout is None else timedelta(seconds=timeout),
        )

    def _resume_kwargs(self, ran: float) -> dict[str, Any]:
        """What ``execute_resumed`` is called with when the trigger fires: how long the try ran."""
        return {"ran": ran}

    def _wait_or_give_up(self, context: Context, exc: OverlapWait) -> BaseException:
        """``overlap="wait"``: reschedule (no worker slot, no retry used) until ``overlap_timeout``."""
        first = context["ti"].get_first_reschedule_date(context)
        if first is not None:
            waited = (datetime.now(tz=timezone.utc) - first).total_seconds()
            if waited > self.overlap_timeout:
                return AirflowException(
                    f"gave up after waiting {waited:.0f}s (overlap_timeout={self.overlap_timeout:g}s) for an "
                    f"earlier run to finish: {outward_text(str(exc))}"
                )
        self.log.info("waiting for an earlier run: %s; checking again in %gs", outward_text(str(exc)), self.overlap_poke)
        return AirflowRescheduleException(datetime.now(tz=timezone.utc) + timedelta(seconds=self.overlap_poke))

    def on_kill(self) -> None:
        """Called from Airflow's SIGTERM handler: only raise the signal (no I/O, no locks).

        A SIGTERM that arrives before the attempt exists is remembered and raised as soon as it does.
        """
        self._terminated = True
        attempt = self._attempt
        if attempt is not None:
            attempt.signal.cancel(Reason.TERMINATED, "the task process received SIGTERM")


def _seconds(value: Any) -> Any:
    """A duration as stored: a ``timedelta`` as seconds, anything else (seconds, None) as given."""
    return value.total_seconds() if isinstance(value, timedelta) else value


#: The operators' declared arguments, in the order of ResumableOperator's signature: its
#: attributes, its docstring's parameters and the docs' table.
OPERATOR_ARGUMENTS: tuple[Option, ...] = tuple(
    ARGUMENTS[name] for name in inspect.signature(ResumableOperator.__init__).parameters if name in ARGUMENTS
)
ResumableOperator.__doc__ = f"{(ResumableOperator.__doc__ or '').rstrip()}\n\n{params_doc(OPERATOR_ARGUMENTS)}\n"


def _lease_lost(exc: BaseException) -> bool:
    return isinstance(exc, LeaseLost) or (isinstance(exc, Cancelled) and exc.reason == Reason.LEASE_LOST.value)


def resume_settle() -> float:
    """Seconds a paused task waits, at least, before it runs again: ``[resumable] resume_settle``,
    by default this worker's ``[workers] min_heartbeat_interval`` plus 2 s. Airflow 3.3's
    supervisor notices a deferred task's process exit up to one such interval late, and the
    scheduler fails a task that runs again before it processed that exit ("state changed
    externally")."""
    configured = conf.get("resumable", "resume_settle", fallback=None)
    if configured not in (None, ""):
        return max(0.0, float(configured))
    return conf.getint("workers", "min_heartbeat_interval", fallback=5) + 2.0


class ChunkedOperator(ResumableOperator):
    """The operator owns the loop: ``read`` a chunk after the position, ``process`` it, checkpoint.

    ``handler_kwargs`` (templated; ``.expand()`` them to map the task over partitions) are passed
    to both ``read`` and ``process``; a reader takes none. Every other argument is
    :class:`ResumableOperator`'s. Its own, from their declarations
    (:data:`airflow_resumable.core.work.chunk_loop.CHUNKED_OPTIONS`):

    """

    # The arguments as stored (a duration as seconds), set in __init__ one line each.
    read: Callable[..., Sequence[Any]]
    process: Callable[..., Any]
    chunk_size: int
    position: Callable[[Any], Any] | None
    total: int | Callable[[RunContext], int | None] | None
    start: Any
    checkpoint_interval: float | None
    skip_on: type[Exception] | tuple[type[Exception], ...] | None
    skip_limit: int

    def __init__(
        self,
        *,
        read: Callable[..., Sequence[Any]],
        process: Callable[..., Any],
        chunk_size: int,
        position: Callable[[Any], Any] | None = None,
        total: int | Callable[[RunContext], int | None] | None = None,
        start: Any = None,
        checkpoint_interval: float | timedelta | None = None,
        skip_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        skip_limit: int = defaults.SKIP_LIMIT,
        **kwargs: Any,
    ) -> None:
        # Stored before ResumableOperator.__init__, whose checks ask _own_problems() about them (each
        # declared argument has its line: a test checks).
        self.read = read
        self.process = process
        self.chunk_size = chunk_size
        self.position = position
        self.total = total
        self.start = start
        self.checkpoint_interval = _seconds(checkpoint_interval)
        self.skip_on = skip_on
        self.skip_limit = skip_limit
        super().__init__(**kwargs)

    def _chunked(self) -> dict[str, Any]:
        """The values of :data:`CHUNKED_OPTIONS`, by name."""
        return {argument.name: getattr(self, argument.name) for argument in CHUNKED_OPTIONS}

    def _own_problems(self) -> list[str]:
        return chunked_problems(self._chunked())

    def _known_inputs(self) -> list[Source]:
        try:
            source = self.read.source() if isinstance(self.read, Reader) else None
        except Exception as exc:  # a reader of one's own: lineage never fails a task
            self.log.warning("OpenLineage: could not name what this task's reader reads (%s); its events go without "
                             "it", type(exc).__name__)
            return []
        return [] if source is None else [source]

    def _call_problems(self, keywords: Collection[str] | None, context: Context | None) -> list[str]:
        return calls_problems(self.read, self.process, keywords)

    def _loop_arguments(self, context: Context) -> dict[str, Any]:
        """:func:`chunk_loop`'s arguments for this try: :data:`CHUNKED_OPTIONS`' values, with
        ``handler_kwargs`` bound to ``read`` (unless it is a reader) and ``process``."""
        read, process, kwargs = self.read, self.process, self.handler_kwargs
        if kwargs:  # e.g. one partition per mapped task instance: .expand(handler_kwargs=[...])
            if not isinstance(read, Reader):  # a reader takes none: they go to process only
                read = functools.partial(self.read, **kwargs)
            process = functools.partial(self.process, **kwargs)
        return {**self._chunked(), "read": read, "process": process}

    def _handler(self, context: Context) -> Callable[[RunContext], Any]:
        arguments = self._loop_arguments(context)
        first = chunk_loop(**arguments)  # its arguments checked before the attempt begins

        def handler(ctx: RunContext) -> None:
            loop, read, process = first, arguments["read"], arguments["process"]
            if isinstance(read, Reader):  # a checkpoint of another reader is refused before anything runs
                try:
                    ctx.use_reader(read)
                except ReaderChanged as refused:
                    held = self._arguments_refused(ctx, arguments, refused)
                    loop, process = chunk_loop(**held), held["process"]
            # Skipped items whose retry was requested go first, one at a time through process; an
            # async process runs on the attempt's event loop, shared with the chunk loop's.
            with SyncCalls(ctx.signal, ctx.log, job=ctx.job, slot=ctx.slot) as calls:
                ctx.replay_skipped(lambda item: calls.sync(process)(ctx, [item]))
                loop(ctx)
            return None  # the summary is the return value

        return handler

    def _arguments_refused(self, ctx: RunContext, arguments: dict[str, Any], refused: ReaderChanged) -> dict[str, Any]:
        """Once the attempt holds the slot's lease and its checkpoint refused ``arguments``' reader
        (:meth:`_loop_arguments`', made before the attempt began): the chunk loop's arguments to
        read with instead, their reader accepted by the checkpoint (a partition's range as its plan
        holds it then), or the refusal raised. Here: the refusal stands.

        Raises:
            ReaderChanged: ``refused``.
        """
        raise refused

    def _summary(self, outcome: Outcome, store: Store, job: str, slot: str) -> dict[str, Any]:
        """With a skip policy, also the slot's skipped items, counted and the first few (from the store)."""
        if self.skip_on is None:
            return super()._summary(outcome, store, job, slot)
        with store.open(autocommit=True) as session:
            count, letters = session.skips.count(job, slot), session.skips.items(
                job, slot, status="skipped", limit=defaults.SKIPPED_SHOWN)
        return task_summary(outcome.checkpoint, skipped=count, skipped_items=letters)


ChunkedOperator.__doc__ = f"{(ChunkedOperator.__doc__ or '').rstrip()}\n\n{params_doc(CHUNKED_OPTIONS)}\n"

