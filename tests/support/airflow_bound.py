"""A pytest plugin for ``make matrix``: on a pair that differs from ``make test``'s only in Airflow's
version (same Python), leave out the core's tests that cannot reach Airflow.

The core imports no Airflow (tests/unit/test_layout.py), and the pins of every Airflow minor agree on
all that is not Airflow's own or its web stack (scripts/constraints.py writes them), so a core test
that imports no Airflow runs the same code on the same Python with the same libraries as it does in
``make test``: a second run of it says nothing new.

Which tests can reach Airflow is read off the imports as they happen, not off a list: every import
statement run from the moment this plugin loads (``-p``: before the conftest files and the test
modules) is recorded as an edge from the importing module, and a test is kept when Airflow is
reachable from its module or from the module of any fixture it uses. A module whose imports were not
seen (imported before this plugin) counts as reaching Airflow when it is the product's or the tests'
own, so an unknown keeps a test rather than leaving it out.

Enabled with ``--skip-airflow-free=DIR`` (a folder of tests, e.g. ``tests/unit/core``).
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib.util
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from support import selection
from support.selection import keep_only

_EDGES: dict[str, set[str]] = defaultdict(set)
# Imported before this plugin: their imports were not seen, except this module's own package chain
# (``support``, whose ``__init__`` is empty, and this file) and its helper, none of which imports Airflow.
_SEEN_BEFORE = frozenset(sys.modules) - {__name__, __name__.rsplit(".", 1)[0], selection.__name__}
#: The project's folder (pytest's rootdir): a module whose file is in it is ours, outside its venvs.
_ROOT: list[Path] = []
_real_import = builtins.__import__


def _recording_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
    module = _real_import(name, globals, locals, fromlist, level)
    importer = (globals or {}).get("__name__")
    if importer:
        try:
            target = importlib.util.resolve_name("." * level + name, globals.get("__package__")) if level else name
        except (ImportError, ValueError):
            target = name
        _EDGES[importer].add(target)
        for attr in fromlist or ():
            if attr != "*":
                _EDGES[importer].add(f"{target}.{attr}")
    return module


builtins.__import__ = _recording_import


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--skip-airflow-free", metavar="DIR", default=None,
                     help="leave out the tests under DIR that cannot reach Airflow (see tests/support/airflow_bound.py)")


def _uses(func: Any) -> set[str]:
    """The modules a fixture's function reaches by the names its body uses (its own and its nested
    functions'): a conftest holds fixtures of the core beside fixtures that run DAGs."""
    found: set[str] = set()
    spaces = getattr(func, "__globals__", {})
    codes = [getattr(func, "__code__", None)]
    while codes:
        code = codes.pop()
        if code is None:
            continue
        for name in code.co_names:
            value = spaces.get(name)
            if value is None:
                continue
            owner = value.__name__ if isinstance(value, type(sys)) else getattr(value, "__module__", None)
            if isinstance(owner, str):
                found.add(owner)
        codes.extend(c for c in code.co_consts if hasattr(c, "co_names"))
    return found


_STATIC: dict[str, set[str]] = {}


@functools.cache
def _own(name: str) -> bool:
    """Whether module ``name`` is the project's own (its file in the project's folder, not a venv's)."""
    source = getattr(sys.modules.get(name), "__file__", None)
    if not source or not _ROOT:
        return False
    path = Path(source).resolve()
    return _ROOT[0] in path.parents and "site-packages" not in path.parts


def _static_imports(name: str) -> set[str]:
    """Every import written anywhere in one of our own modules, function bodies included: an import
    of Airflow inside a function runs only when it is called, after the tests were collected."""
    if name not in _STATIC:
        found: set[str] = set()
        module = sys.modules.get(name)
        source = getattr(module, "__file__", None)
        if source and source.endswith(".py"):
            package = module.__package__ if module is not None else None
            for node in ast.walk(ast.parse(Path(source).read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    found.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom):
                    try:
                        base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) \
                            if node.level else (node.module or "")
                    except (ImportError, ValueError):
                        continue
                    found.add(base)
                    found.update(f"{base}.{alias.name}" for alias in node.names)
        _STATIC[name] = found
    return _STATIC[name]


def _reaches_airflow(root: str, memo: dict[str, bool]) -> bool:
    """Whether Airflow is reachable from module ``root``: through the imports seen run, and through
    every import written in a module of ours reached by an import (its functions may be called). A
    package reached only as the parent of a submodule counts with the imports its ``__init__`` ran,
    not those written in it (``airflow_resumable``'s names that import Airflow load when first asked
    for)."""
    stack, seen = [(root, True)], set()
    while stack:
        name, imported = stack.pop()
        if (name, imported) in seen:
            continue
        seen.add((name, imported))
        if name == "airflow" or name.startswith("airflow."):
            return True
        if memo.get(name):
            return True
        own = _own(name)
        if name in _SEEN_BEFORE and own:
            return True  # imported before its imports could be seen: keep its tests
        stack.extend((target, True) for target in _EDGES.get(name, ()))
        if imported and own:
            stack.extend((target, True) for target in _static_imports(name))
        if "." in name:
            stack.append((name.rsplit(".", 1)[0], False))  # a submodule runs its package's __init__ too
    memo[root] = False
    return False


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    folder = config.getoption("--skip-airflow-free")
    if not folder:
        return
    _ROOT[:] = [Path(config.rootpath).resolve()]
    under = (Path(config.rootpath) / folder).resolve()
    memo: dict[str, bool] = {}

    def keeps(item: pytest.Item) -> bool:
        path = Path(str(item.path)).resolve()
        module = getattr(item, "module", None)
        if under not in path.parents or module is None:
            return True
        roots = {module.__name__}
        info = getattr(item, "_fixtureinfo", None)
        for defs in (info.name2fixturedefs.values() if info is not None else ()):
            for d in defs:
                roots.update(_uses(d.func))
        return any(r and _reaches_airflow(r, memo) for r in roots)

    keep_only(config, items, keeps)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The tests are chosen: imports run from now on are not recorded (nor slowed)."""
    builtins.__import__ = _real_import
