"""The package's layout holds its rules: rooms that never import each other, at most 10 floors, no two
core modules named alike, and the contributor guide's map as the code stands. The tests' layout holds
its own: tests/unit/ follows the package's folders, every test module is in unit/, integration/ or
system/, and none imports from another test module (what two share is in tests/support/).

No line count is a rule: a module holds one concern whatever its length (a cap made files split only
to pass it).

No Airflow here (``make lint`` runs this module)."""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import pytest

from devtools import layout
from support.paths import ROOT


def test_no_two_rooms_import_each_other_and_the_package_stands_on_at_most_ten_floors() -> None:
    graph, edges = layout.room_graph()
    assert ("core/attempt", "core/stores") in {(a, b) for a, b, _, _ in edges}  # the graph sees imports
    floors = layout.floors(graph)  # raises on a circle, naming it
    # The package's face (airflow_resumable/__init__.py) stands one floor above the highest room it names.
    assert max(floors.values()) + 1 <= 10, sorted(floors.items(), key=lambda kv: -kv[1])


def test_the_core_stands_in_the_order_of_its_roles() -> None:
    """model below stores below attempt below readers below work below control: an import that ran the
    other way (a store reaching for a partition's name, a model module for the lease) fails here."""
    floors = layout.floors(layout.room_graph()[0])
    order = ["core/model", "core/stores", "core/attempt", "core/readers", "core/work", "core/control"]
    assert [floors[room] for room in order] == sorted(floors[room] for room in order), floors
    assert len({floors[room] for room in order}) == len(order), floors


def test_the_core_imports_nothing_of_the_airflow_layer() -> None:
    _, edges = layout.room_graph()
    up = [(module, line, to) for room, to, module, line in edges if room.startswith("core/") and not to.startswith("core/")
          and to not in ("version.py",)]
    assert not up, up


def _stem(name: str) -> str:
    """What a module's name says, its grammatical ending left out (chunks, chunked, chunking: chunk)."""
    return re.sub(r"(ing|ed|es|s)$", "", name)


def test_no_two_modules_of_the_core_are_named_alike() -> None:
    core = [m for m in layout.modules().values() if m.room.startswith("core/") and m.path.name != "__init__.py"]
    seen: dict[str, str] = {}
    clashes = []
    allowed = {"base"}  # each folder's base types: one meaning wherever it stands
    folders = {p.name for p in (layout.PACKAGE / "core").rglob("*") if p.is_dir() and p.name != "__pycache__"}
    for m in core:
        stem = _stem(m.path.stem)
        if stem in allowed:
            continue
        if stem in seen:
            clashes.append((seen[stem], m.name))
        seen[stem] = m.name
        if stem in {_stem(folder) for folder in folders}:
            clashes.append((m.name, "a folder of the core"))
    assert not clashes, clashes


def test_an_airflow_layer_module_shares_a_name_only_with_the_core_room_it_is_the_face_of() -> None:
    known = layout.modules()
    core_names = {_stem(p.stem) for p in (layout.PACKAGE / "core").rglob("*") if p.name != "__init__.py"} - {"base"}
    for m in known.values():
        if m.room.startswith("core/") or m.path.name == "__init__.py" or m.path.parent != layout.PACKAGE:
            continue
        if _stem(m.path.stem) not in core_names:
            continue
        face = layout.FACES.get(m.path.stem)
        assert face is not None, f"{m.name} is named like a module or folder of the core: name it for what it is"
        targets = {known[t].room for t, _ in layout.imports(m, known)}
        assert face.replace(".", "/") in targets, f"{m.name} is the face of {face} but imports nothing from it"


def test_the_contributor_guide_s_map_is_the_package_as_it_stands() -> None:
    text = (ROOT / "docs" / "contributing.md").read_text()
    found = re.search(r"<!-- layout:begin[^>]*-->\n(.*?)<!-- layout:end -->", text, re.S)
    assert found, "docs/contributing.md lost its layout markers"
    assert found.group(1) == layout.render(), (
        "the map in docs/contributing.md is not the package as it stands: paste the output of "
        "`python -m devtools.layout` between its markers")


def test_a_module_s_path_before_0_5_0_still_imports_with_a_deprecation_warning() -> None:
    import importlib
    import sys

    from airflow_resumable.core import _moved
    from airflow_resumable.core.attempt import runner

    for old in ("airflow_resumable.core.runner", "airflow_resumable.core.readers.keys"):
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match="moved to airflow_resumable.core"):
            module = importlib.import_module(old)
        assert module is importlib.import_module("airflow_resumable.core." + _moved.MOVED[old.split("core.", 1)[1]])
        assert module.__spec__.name == module.__name__  # the module keeps its own spec
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert importlib.import_module("airflow_resumable.core.attempt.runner") is runner  # the new path: no warning
    for new in _moved.MOVED.values():
        importlib.import_module("airflow_resumable.core." + new)  # every target exists


# -- the tests' layout ------------------------------------------------------------------------------

TESTS = ROOT / "tests"
PACKAGE = ROOT / "airflow_resumable"
#: The folders a test module lives in, each its own marker (tests/conftest.py).
TEST_FOLDERS = ("unit", "integration", "system")


def _folders(top: Path) -> list[Path]:
    return sorted(p for p in top.rglob("*") if p.is_dir() and p.name != "__pycache__")


def test_every_unit_test_folder_is_a_package_folder_of_the_same_path() -> None:
    """tests/unit/core/attempt/ holds the tests of airflow_resumable/core/attempt/, and so on: where a
    module's tests are follows from where the module is. Each folder is a package, so a test module
    may carry the name of the module it covers even where two folders hold modules of that name."""
    strays = [str(f.relative_to(TESTS)) for f in _folders(TESTS / "unit") if not (PACKAGE / f.relative_to(TESTS / "unit")).is_dir()]
    assert not strays, f"test folders with no package folder of the same path: {strays}"
    not_packages = [str(f.relative_to(TESTS)) for f in [TESTS, *(TESTS / t for t in TEST_FOLDERS), *_folders(TESTS / "unit")]
                    if not (f / "__init__.py").is_file()]
    assert not not_packages, f"test folders without an __init__.py: {not_packages}"


def test_every_test_module_is_in_unit_integration_or_system() -> None:
    strays = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")
                    if p.relative_to(TESTS).parts[0] not in TEST_FOLDERS)
    assert not strays, f"test modules outside tests/unit, tests/integration and tests/system: {strays}"


def _is_test_module(dotted: str) -> bool:
    """``tests.unit.core.test_lease``, ``test_lease``, ``tests.conftest``: a test module or a conftest."""
    return any(part.startswith("test_") or part == "conftest" for part in dotted.split("."))


def _test_modules_imported(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, dotted name) of every test module ``path`` imports from, however spelt: ``import a.test_b``,
    ``from a.test_b import c``, ``from a import test_b``, ``from test_b import c``, and relative imports
    resolved against the folder of ``path`` (``from .test_b import c``, ``from . import test_b``)."""
    package = ".".join(path.parent.relative_to(root).parts)
    own = ".".join(path.relative_to(root).with_suffix("").parts)
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if _is_test_module(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            base = layout.absolute(node, package)
            if _is_test_module(base):
                found.append((node.lineno, base))
            else:  # from a package: a name may be a module of it
                found += [(node.lineno, dotted) for alias in node.names
                          if _is_test_module(dotted := f"{base}.{alias.name}" if base else alias.name)]
    return sorted((line, dotted) for line, dotted in found if dotted != own)


def test_the_test_module_import_rule_sees_every_spelling(tmp_path: Path) -> None:
    """The rule below reads imports as Python does: absolute, bare, relative, nested in a function."""
    folder = tmp_path / "tests" / "unit"
    folder.mkdir(parents=True)
    module = folder / "test_a.py"
    module.write_text("\n".join([
        "from tests.unit.test_b import x",  # 1
        "import tests.unit.test_b",  # 2
        "from tests.unit import test_b",  # 3
        "from test_b import x",  # 4
        "from .test_b import x",  # 5
        "from . import test_b",  # 6
        "from ..conftest import fixture",  # 7
        "import conftest",  # 8
        "def f():\n    from tests.unit.test_b import x",  # 9-10: inside a function too
        "from support.paths import ROOT",  # 11: not a test module
        "from . import support_b, test_a",  # 12: itself (test_a) is no offence
        "import pytest, tests.unit.test_c as c",  # 13
    ]))
    assert _test_modules_imported(module, tmp_path) == [
        (1, "tests.unit.test_b"), (2, "tests.unit.test_b"), (3, "tests.unit.test_b"), (4, "test_b"),
        (5, "tests.unit.test_b"), (6, "tests.unit.test_b"), (7, "tests.conftest"), (8, "conftest"),
        (10, "tests.unit.test_b"), (13, "tests.unit.test_c"),
    ]


def test_no_test_module_imports_from_another_test_module() -> None:
    """A test module (or a conftest.py) takes what it shares with others from tests/support/, never
    from another test module: importing one runs its module-level code, may carry its fixtures along,
    and ties two modules' tests together. Every spelling counts (see the test above)."""
    modules = sorted([*TESTS.rglob("test_*.py"), *TESTS.rglob("conftest.py")])
    assert len(modules) > 50  # the walk sees the suite
    offenders = [f"{path.relative_to(TESTS)}:{line} imports from {dotted}"
                 for path in modules for line, dotted in sorted(set(_test_modules_imported(path)))]
    assert not offenders, ("test modules importing from other test modules (move what they share to tests/support/):\n  "
                           + "\n  ".join(offenders))
