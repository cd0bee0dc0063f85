"""What the resumable operators answer the OpenLineage provider (the ``openlineage`` extra).

The provider's listener asks each task for its lineage when it starts, completes and fails
(``get_openlineage_facets_on_start()``, ``..._on_complete(task_instance)``,
``..._on_failure(task_instance)``) and puts the answer into its events. The answers are built by
:mod:`airflow_resumable.lineage.facets` from the attempt's plain facts (:class:`AttemptFacts`,
kept on the operator by ``execute()``). Without the provider nobody calls these methods.
Building an answer never fails the task: a failure is logged, and the event goes without it.

The listener calls them in a forked process (or a thread) of the task's. Naming a table's
datasource means looking its Airflow connection up, which a forked process cannot always do (its
request to the worker's supervisor may never be answered: the event is then lost after
``[openlineage] execution_timeout``). So the names are looked up in the task's own process, only
when the provider listens (:func:`lineage_listening`): the reader's once the task's arguments are
rendered (``render_template_fields``, which Airflow's task runner calls just before the listener's
START), what the attempt read and wrote at the end of each execution.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections.abc import Iterable, Sequence
from typing import Any

from airflow_resumable.core.model.observe import AttemptFacts, Part, Source
from airflow_resumable.core.model.outward import outward_traceback

__all__ = ["OpenLineageMethods", "lineage_listening"]


@functools.cache
def lineage_listening() -> bool:
    """Whether the OpenLineage provider is installed and listens (it does once a transport is
    configured): asked once per process."""
    try:
        if importlib.util.find_spec("airflow.providers.openlineage") is None:
            return False
        from airflow_resumable.version_compat import openlineage_conf

        return not openlineage_conf.is_disabled()
    except Exception:  # a broken install: no lineage, never a failed task
        return False


class OpenLineageMethods:
    """The three methods OpenLineage's default extractor calls, for a resumable operator."""

    #: The last attempt's facts, kept by ``execute()`` for the complete and failure events.
    _observed: AttemptFacts | None = None
    #: The datasets each source stands for, looked up in the task's own process (see the module).
    _lineage_names: dict[Source, list[tuple[str, str]]] | None = None
    log: Any
    outlets: Any

    def get_openlineage_facets_on_start(self) -> Any:
        """The start event's lineage: the job, the slot, the try (and a partition's place); the
        inputs the task's reader names."""
        return self._openlineage(None, status="running")

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The complete event's lineage: the attempt's facts, inputs and outputs."""
        return self._openlineage(task_instance, status="done")

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """The failure event's lineage: the attempt's facts (where it stopped, and why)."""
        return self._openlineage(task_instance, status="failed")

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Airflow's rendering of the task's arguments, then (in the task's own process, before the
        provider's START event) the naming of what the task's reader reads: so START carries the
        reader's table too."""
        super().render_template_fields(context, jinja_env)  # type: ignore[misc]
        self._name_datasets(None)

    # -- what the operators fill in ------------------------------------------------------------

    def _known_inputs(self) -> Sequence[Source]:
        """What the task reads, known before it runs (a ``ChunkedOperator``'s reader)."""
        return ()

    def _partition_place(self, context: Any) -> Part | None:
        """A partition's place in its partitioned job (None: not a partition)."""
        return None

    def job_name(self, context: Any) -> str:
        raise NotImplementedError

    def _observe(self, facts: AttemptFacts, context: Any) -> AttemptFacts:
        """The attempt's facts as the events carry them (with a partition's place in its job)."""
        place = self._partition_place(context)
        return facts if place is None else dataclasses.replace(facts, partition=place)

    def _facts_without_attempt(self, context: Any, status: str) -> AttemptFacts:
        """The facts of a task before its attempt's (the start event), or of one whose attempt never
        began (a bad argument, a busy slot): who it is."""
        from airflow_resumable.operators.task_instance import slot_of

        facts = AttemptFacts(job=self.job_name(context), slot=slot_of(context)[0], attempt=context["ti"].try_number,
                             status=status)
        return self._observe(facts, context)

    def _name_datasets(self, facts: AttemptFacts | None) -> None:
        """Look up the datasets of what the task read and wrote, in the task's own process, when the
        provider listens: what the listener's callbacks name (they look nothing up themselves).
        Never raises: it runs as the execution ends, whichever way."""
        try:
            if not lineage_listening():
                return
            from airflow_resumable.lineage.facets import look_up

            names = dict(self._lineage_names or {})
            sources: Iterable[Source] = [*self._known_inputs(), *(facts.inputs if facts else ()),
                                         *(facts.outputs if facts else ())]
            names.update(look_up([s for s in sources if s not in names], self.log))
            self._lineage_names = names
        except Exception as failed:
            self.log.warning("OpenLineage: could not name this task's datasets; its events go without them: %s",
                             outward_traceback(failed))

    # -- the one path ----------------------------------------------------------------------------

    def _openlineage(self, task_instance: Any, *, status: str) -> Any:
        try:
            from airflow_resumable.lineage.facets import operator_lineage
            from airflow_resumable.version_compat import get_current_context

            observed = self._observed if task_instance is not None else None
            if observed is None:  # the start event, or no attempt began
                observed = self._facts_without_attempt(get_current_context(), status)
            return operator_lineage(observed, inputs=self._known_inputs(), outlets=list(self.outlets or ()),
                                    names=self._lineage_names or {}, log=self.log)
        except Exception as failed:
            self.log.warning("OpenLineage: could not build this task's lineage; the event goes without it (the task "
                             "is not affected): %s", outward_traceback(failed))
            return None
