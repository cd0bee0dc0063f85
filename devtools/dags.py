"""DAG objects by id from one folder, for code that runs them with ``dag.test()`` (tests, bench)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
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
        return self.find(dag_id)[0]

    def find(self, dag_id: str) -> tuple[Any, Path]:
        """The DAG object with this id and the file that defines it."""
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
                    return value, path
        raise LookupError(f"no DAG {dag_id!r} in {self.folder}")


@contextmanager
def only_file(path: Path) -> Iterator[None]:
    """Airflow parses only ``path`` of its folder while inside: an ``.airflowignore`` (glob
    syntax) there lists every other ``*.py``, and is removed on the way out.

    ``dag.test()`` parses and writes to the metadata database every DAG of the folder the DAG
    comes from, on every call (Airflow 3.3's ``DAG.test``: the owning bundle is synced whole);
    with a hundred DAGs beside it that is most of a short run's time. The DAG's own file is still
    parsed, so the DAGs defined beside it are synced as before.
    """
    ignore = path.parent / ".airflowignore"
    others = sorted(p.name for p in path.parent.glob("*.py") if p.name != path.name)
    ignore.write_text("".join(f"/{name}\n" for name in others))
    try:
        yield
    finally:
        ignore.unlink(missing_ok=True)
