"""Every import from Airflow, in one place, for every supported Airflow (3.1, 3.2, 3.3).

As Airflow's own providers do (``providers/standard``'s ``version_compat.py``): version flags
computed from the installed Airflow, and each name imported from where that version keeps it.
The rest of the package imports Airflow names from here only (a test checks), so a new release
has one module to look at.

Where a name moved:

| name | 3.2 and later | 3.1 |
|---|---|---|
| exceptions (``AirflowException``, ``TaskDeferred``...) | ``airflow.sdk.exceptions`` | ``airflow.exceptions`` |
| ``KeywordParameters`` | ``airflow.sdk.bases.decorator`` | ``airflow.utils.operator_helpers`` |
| ``conf`` | ``airflow.sdk.configuration`` | ``airflow.configuration`` |
| ``Stats`` | ``airflow.sdk.observability.stats`` | ``airflow.stats`` |
| ``serialize``/``deserialize`` | ``airflow.sdk.serde`` | ``airflow.serialization.serde`` |

What needs a newer Airflow (:data:`FEATURES`) degrades with a message that names the feature and
the version it needs (:func:`needs`): ``retry_policy=`` (3.3) is refused at parse time with that
message, and ``airflow resumable ...`` (provider CLI commands, 3.2) is
``python -m airflow_resumable ...`` on 3.1, which says so.

What the installed Airflow cannot do with the packages beside it is said once, when this module is
imported (:func:`environment_problems`): Airflow 3.2's in-process Execution API (``dag.test()``,
the triggerer, the dag-processor) answers every request with a 500 where svcs 26.2 or later is
installed, so the 3.2 constraints files pin svcs below 26.2 (scripts/constraints.py's ``CAPS``).

Names used only in some processes (the CLI's, the api-server's, a provider's) are imported when
first used (:data:`_LAZY`): importing this module stays cheap on workers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from airflow import __version__ as AIRFLOW_VERSION_STRING  # noqa: N812 - Airflow's name, kept visible
from packaging.version import Version


def get_base_airflow_version_tuple() -> tuple[int, int, int]:
    """The installed Airflow's (major, minor, micro), without pre-release or local parts."""
    version = Version(AIRFLOW_VERSION_STRING)
    return version.major, version.minor, version.micro


AIRFLOW_VERSION: tuple[int, int, int] = get_base_airflow_version_tuple()
AIRFLOW_V_3_1_PLUS: bool = AIRFLOW_VERSION >= (3, 1, 0)
AIRFLOW_V_3_2_PLUS: bool = AIRFLOW_VERSION >= (3, 2, 0)
AIRFLOW_V_3_3_PLUS: bool = AIRFLOW_VERSION >= (3, 3, 0)

#: The oldest Airflow this release runs on; setup.cfg's install_requires says the same.
MINIMUM_AIRFLOW: tuple[int, int] = (3, 1)

#: Features that need a newer Airflow than the oldest supported: name -> (the Airflow it needs, the
#: way to do without it).
FEATURES: dict[str, tuple[tuple[int, int], str]] = {
    "retry_policy=": ((3, 3), "leave retry_policy out: retries and retry_delay apply as usual"),
    "airflow resumable ... (provider CLI commands)": (
        (3, 2), "run the same commands as python -m airflow_resumable ..."),
    "the task state store mirror": ((3, 3), "read the same summary on the Checkpoint tab, in XCom or with the CLI"),
}


def supports(feature: str) -> bool:
    """Whether the installed Airflow has ``feature`` (a key of :data:`FEATURES`)."""
    return AIRFLOW_VERSION[:2] >= FEATURES[feature][0]


def needs(feature: str) -> str:
    """The sentence saying that ``feature`` needs a newer Airflow than the installed one, and what to
    do instead (an upgrade, or :data:`FEATURES`' way to do without it)."""
    (major, minor), instead = FEATURES[feature]
    return (f"{feature} needs Airflow {major}.{minor} or later (this is Airflow {AIRFLOW_VERSION_STRING}): "
            f"upgrade Airflow, or {instead}")


def environment_problems(airflow: tuple[int, ...] | None = None, installed: dict[str, str] | None = None) -> list[str]:
    """What breaks in the installed Airflow because of a package version beside it: a sentence each,
    naming the fix (none on a supported, constraints-pinned install). ``airflow`` (major, minor) and
    ``installed`` (name -> version) default to this environment's."""
    airflow = AIRFLOW_VERSION[:2] if airflow is None else tuple(airflow[:2])
    problems = []
    if airflow == (3, 2):
        svcs = installed.get("svcs") if installed is not None else _installed_version("svcs")
        if svcs and Version(svcs) >= Version("26.2"):
            problems.append(
                f"Airflow 3.2 with svcs {svcs}: Airflow's in-process Execution API (dag.test(), the triggerer, the "
                "dag-processor) answers every request with a 500 ('State' object has no attribute "
                "'svcs_registry'), because svcs 26.2's lifespan removes the registry when Airflow 3.2 lets it "
                "end. Install svcs<26.2 (pip install 'svcs<26.2'; constraints/airflow-3.2-*.txt pins it), "
                "or upgrade Airflow to 3.3")
    return problems


def _installed_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


if AIRFLOW_VERSION[:2] < MINIMUM_AIRFLOW:  # pragma: no cover - pip refuses such an install
    raise ImportError(
        f"airflow-resumable needs Airflow {MINIMUM_AIRFLOW[0]}.{MINIMUM_AIRFLOW[1]} or later; this is Airflow "
        f"{AIRFLOW_VERSION_STRING}. Upgrade Airflow, or install an airflow-resumable release made for it"
    )

for _problem in environment_problems():  # said once per process, where Airflow imports the provider
    import warnings

    warnings.warn(_problem, RuntimeWarning, stacklevel=2)

from airflow.plugins_manager import AirflowPlugin  # noqa: E402 - after the version check
from airflow.sdk import BaseHook, BaseOperator, Context, XComArg  # noqa: E402
from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory  # noqa: E402
from airflow.triggers.base import BaseTrigger, TriggerEvent  # noqa: E402

# The newest Airflow's names are the ones type-checked (TYPE_CHECKING): the older branch is theirs.
if AIRFLOW_V_3_2_PLUS or TYPE_CHECKING:
    from airflow.sdk.bases.decorator import KeywordParameters
    from airflow.sdk.configuration import conf
    from airflow.sdk.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowNotFoundException,
        AirflowRescheduleException,
        AirflowSkipException,
        TaskDeferred,
    )
    from airflow.sdk.observability.stats import Stats
    from airflow.sdk.serde import deserialize as serde_deserialize
    from airflow.sdk.serde import serialize as serde_serialize
else:  # Airflow 3.1
    from airflow.configuration import conf
    from airflow.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowNotFoundException,
        AirflowRescheduleException,
        AirflowSkipException,
        TaskDeferred,
    )
    from airflow.serialization.serde import (
        deserialize as serde_deserialize,
    )
    from airflow.serialization.serde import (
        serialize as serde_serialize,
    )
    from airflow.stats import Stats
    from airflow.utils.operator_helpers import KeywordParameters

if AIRFLOW_V_3_3_PLUS or TYPE_CHECKING:
    from airflow.sdk.definitions.retry_policy import ExceptionRetryPolicy, RetryAction, RetryDecision, RetryPolicy
else:  # Airflow 3.1, 3.2: no retry policies (AIP-105). Stand-ins with the same shape, so that the
    # outcome table's code reads the same; no task can have a policy (ResumableOperator refuses
    # retry_policy= there, saying it needs 3.3), so they are never asked anything.
    import abc
    import enum
    from dataclasses import dataclass
    from datetime import timedelta

    class RetryAction(enum.Enum):
        RETRY = "retry"
        FAIL = "fail"
        DEFAULT = "default"

    @dataclass(frozen=True)
    class RetryDecision:
        action: RetryAction = RetryAction.DEFAULT
        retry_delay: timedelta | None = None
        reason: str | None = None

        @classmethod
        def default(cls) -> RetryDecision:
            return cls(action=RetryAction.DEFAULT)

    class RetryPolicy(abc.ABC):
        @abc.abstractmethod
        def evaluate(self, exception: BaseException, try_number: int, max_tries: int,
                     context: Any = None) -> RetryDecision: ...

        def serialize(self) -> dict[str, Any]:
            raise NotImplementedError(needs("retry_policy="))

    class ExceptionRetryPolicy(RetryPolicy):
        rules: list[Any]

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise TypeError(needs("retry_policy="))


def built_from_mapped(operator: object) -> bool:
    """Whether Airflow is building ``operator`` as a mapped task instance, on the worker and outside
    ``execute()``: BaseOperator's private ``__from_mapped`` flag (Airflow 3.1 to 3.3; no public name)."""
    return bool(getattr(operator, "_BaseOperator__from_mapped", False))


#: Names imported on first use, from the module that holds them in every supported Airflow: the CLI's
#: (imported by every ``airflow`` command line), the api-server's, the providers'.
_LAZY: dict[str, tuple[str, str]] = {
    "ARG_OUTPUT": ("airflow.cli.cli_config", "ARG_OUTPUT"),
    "ActionCommand": ("airflow.cli.cli_config", "ActionCommand"),
    "Arg": ("airflow.cli.cli_config", "Arg"),
    "GroupCommand": ("airflow.cli.cli_config", "GroupCommand"),
    "lazy_load_command": ("airflow.cli.cli_config", "lazy_load_command"),
    "AirflowConsole": ("airflow.cli.simple_table", "AirflowConsole"),
    "SimpleTable": ("airflow.cli.simple_table", "SimpleTable"),
    "GetUserDep": ("airflow.api_fastapi.core_api.security", "GetUserDep"),
    "get_auth_manager": ("airflow.api_fastapi.app", "get_auth_manager"),
    "DagAccessEntity": ("airflow.api_fastapi.auth.managers.models.resource_details", "DagAccessEntity"),
    "DagDetails": ("airflow.api_fastapi.auth.managers.models.resource_details", "DagDetails"),
    "DagModel": ("airflow.models.dag", "DagModel"),
    "core_conf": ("airflow.configuration", "conf"),
    "settings": ("airflow", "settings"),
    "ObjectStoragePath": ("airflow.sdk", "ObjectStoragePath"),
    "PostgresHook": ("airflow.providers.postgres.hooks.postgres", "PostgresHook"),
    "DEFAULT_CELERY_CONFIG": ("airflow.providers.celery.executors.default_celery", "DEFAULT_CELERY_CONFIG"),
    "TaskGroup": ("airflow.sdk", "TaskGroup"),
    # The metadata database, where only the api-server and the CLI reach it (re-running task instances).
    "TaskInstance": ("airflow.models.taskinstance", "TaskInstance"),
    "clear_task_instances": ("airflow.models.taskinstance", "clear_task_instances"),
    "TaskInstanceState": ("airflow.utils.state", "TaskInstanceState"),
    "create_session": ("airflow.utils.session", "create_session"),
    "XComModel": ("airflow.models.xcom", "XComModel"),
    "Log": ("airflow.models.log", "Log"),
    # The running task's context where Airflow does not pass it (the OpenLineage listener's calls).
    "get_current_context": ("airflow.sdk", "get_current_context"),
    # The OpenLineage provider (the `openlineage` extra), asked only when it calls the operators.
    "OperatorLineage": ("airflow.providers.openlineage.extractors", "OperatorLineage"),
    "ExtractorManager": ("airflow.providers.openlineage.extractors.manager", "ExtractorManager"),
    "OpenLineageAdapter": ("airflow.providers.openlineage.plugins.adapter", "OpenLineageAdapter"),
    "SQLParser": ("airflow.providers.openlineage.sqlparser", "SQLParser"),
    "openlineage_conf": ("airflow.providers.openlineage", "conf"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AIRFLOW_VERSION",
    "AIRFLOW_VERSION_STRING",
    "AIRFLOW_V_3_1_PLUS",
    "AIRFLOW_V_3_2_PLUS",
    "AIRFLOW_V_3_3_PLUS",
    "FEATURES",
    "MINIMUM_AIRFLOW",
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
    "TaskDeferred",
    "TriggerEvent",
    "XComArg",
    "built_from_mapped",
    "conf",
    "environment_problems",
    "get_base_airflow_version_tuple",
    "needs",
    "serde_deserialize",
    "serde_serialize",
    "supports",
    "task_decorator_factory",
]
