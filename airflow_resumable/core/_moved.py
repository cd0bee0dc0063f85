"""Where the core's modules were before release 0.5.0 folded them into folders by role.

Importing an old path (``airflow_resumable.core.checkpoint``, ``airflow_resumable.core.runner`` ...)
still works for one release: it gives the module at its new place, the same object, and warns with a
:class:`DeprecationWarning` naming the new path. ``airflow_resumable.core.control`` is the folder of
the control requests now; it offers the old module's names itself (see ``core/control/__init__.py``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install"]

_CORE = "airflow_resumable.core."

#: Old module (under ``airflow_resumable.core``) -> its place since 0.5.0.
MOVED: dict[str, str] = {
    "checkpoint": "model.checkpoint",
    "states": "model.states",
    "rules": "model.request_rules",
    "schema": "model.columns",
    "tables": "model.tables",
    "errors": "model.errors",
    "defaults": "model.defaults",
    "options": "model.options",
    "identity": "model.identity",
    "fence": "model.fence",
    "positions": "model.positions",
    "observe": "model.observe",
    "lent": "stores.transaction.handle",
    "lent_postgres": "stores.transaction.postgres_cursors",
    "statements": "stores.transaction.statements",
    "readers.keys": "model.keys",
    "migrations": "stores.migrations",
    "stores.sql": "stores.shared_sql",
    "runner": "attempt.runner",
    "acquire": "attempt.acquire",
    "chunks": "attempt.context",
    "finish": "attempt.finish",
    "attempt_state": "attempt.given",
    "tally": "attempt.tally",
    "lease": "attempt.lease",
    "signal": "attempt.signal",
    "context": "attempt.context",
    "pipeline": "attempt.pipeline",
    "progress": "attempt.reporter",
    "aio": "attempt.async_bridge",
    "skips": "attempt.skip_policy",
    "chunked": "work.chunk_loop",
    "partitions": "work.partitions",
    "job_summary": "work.partition_summary",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the module at its new place, with a warning."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_CORE) or fullname[len(_CORE):] not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = _CORE + MOVED[spec.name[len(_CORE):]]
        warnings.warn(f"{spec.name} moved to {new} in airflow-resumable 0.5.0; import it from there (the old path "
                      "goes in the next release)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the old path's spec on the module: give it back its own.
        module.__spec__ = self._specs.pop(str(getattr(module.__spec__, "name", "")), module.__spec__)


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (the core's ``__init__`` calls it)."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())
