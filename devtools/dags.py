"""DAG objects by id from one folder, for code that runs them with ``dag.test()`` (tests, bench)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any


class DagFolder:
    """Imports each ``*.py`` of ``folder`` once (as ``<prefix><stem>``) and finds DAGs by id."""

    def __init__(self, folder: Path, prefix: str):
        self.folder = folder
        self.prefix = prefix
        self._modules: dict[Path, Any] = {}

    def load(self, dag_id: str) -> Any:
        """The DAG object with this id."""
        from airflow.sdk import DAG

        for path in sorted(self.folder.glob("*.py")):
            module = self._modules.get(path)
            if module is None:
                spec = importlib.util.spec_from_file_location(f"{self.prefix}{path.stem}", path)
                assert spec and spec.loader
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                self._modules[path] = module
            for value in vars(module).values():
                if isinstance(value, DAG) and value.dag_id == dag_id:
                    return value
        raise LookupError(f"no DAG {dag_id!r} in {self.folder}")
