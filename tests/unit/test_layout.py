"""The package's layout holds its rules: rooms that never import each other, at most 10 floors, no two
modules of one core folder named alike, and the contributor guide's map as the code stands. The tests' layout holds
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
    """What a module's name says, its grammatical ending left out (chunks, chunked, chunking: chunk;
    runner, running: run)."""
    return re.sub(r"([b-df-hj-np-tv-z])\1$", r"\1", re.sub(r"(ing|er|ed|es|s)$", "", name))


def test_no_two_modules_of_one_folder_of_the_core_are_named_alike() -> None:
    """Within a folder, two names that differ only by an ending (chunks, chunked; runner, running) would make a reader
    guess which holds what. Across folders a name may repeat: the folder says the role (the stores'
    ``requests.py`` writes what the control folder's ``requests.py`` asks), as Airflow's providers
    keep ``hooks/postgres.py`` beside ``dialects/postgres.py``."""
    assert _stem("runner") == _stem("running") == "run" and _stem("chunks") == _stem("chunked") == "chunk"
    core = [m for m in layout.modules().values() if m.room.startswith("core/") and m.path.name != "__init__.py"]
    seen: dict[tuple[Path, str], str] = {}
    clashes = []
    for m in core:
        key = (m.path.parent, _stem(m.path.stem))
        if key in seen:
            clashes.append((seen[key], m.name))
        seen[key] = m.name
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


# -- the package's text names what exists ---------------------------------------------------------

def _module_file(dotted: list[str]) -> tuple[Path, list[str]] | None:
    """The file of the longest module prefix of ``dotted`` (``airflow_resumable.core.view.liveness_of``
    -> core/view.py, ["liveness_of"]), None when not even the package's first folder exists."""
    for i in range(len(dotted), 1, -1):
        base = ROOT.joinpath(*dotted[:i])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate, dotted[i:]
    return None


def _named_paths(text: str) -> list[str]:
    return re.findall(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.py)\b", text)


def _defined(module: Path) -> set[str]:
    """The names ``module`` defines or imports at any depth (a dotted name's first name after its module
    must be one of them: a word that only appears in the module's text, say in a comment, is not)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(), str(module))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _old_paths() -> set[str]:
    """The core's module paths before 0.5.0 (:data:`airflow_resumable.core._moved.MOVED`), dotted and as files."""
    from airflow_resumable.core import _moved

    return {form for old in _moved.MOVED for form in (f"airflow_resumable.core.{old}", old.replace(".", "/") + ".py")}


def _misnamed(source: Path, *, old_paths: bool = False) -> list[str]:
    """What ``source``'s text names that does not exist: a file path (``stores/checkpoints.py``, read
    from the repository, the package, the core, one of the core's folders or the module's own folder)
    or a dotted name of the package (its module, and the first name after it defined there, or a
    module of it). A module's path before 0.5.0 still imports, through the moved-modules map: it is
    named only where ``old_paths`` says the text is about the move (the map, the changelog)."""
    text = source.read_text()
    core = PACKAGE / "core"
    bases = [ROOT, PACKAGE, core, source.parent, ROOT / "tests", *(d for d in core.iterdir() if d.is_dir())]
    wrong = [path for path in _named_paths(text) if not any((base / path).exists() for base in bases)]
    # A folder of the package (``core/attempt/``, ``airflow_resumable/core/stores/transaction``)
    wrong += [path for path in re.findall(r"(?<![\w./-])((?:airflow_resumable|core)(?:/\w+)+)/?(?![\w.])", text)
              if not ((ROOT / path).is_dir() or (PACKAGE / path).is_dir())]
    for dotted in set(re.findall(r"\bairflow_resumable(?:\.\w+)+", text)):
        found = _module_file(dotted.split("."))
        if found is None:
            wrong.append(dotted)
            continue
        module, rest = found
        if rest and rest[0] not in _defined(module):
            wrong.append(dotted)
    if old_paths:
        moved = _old_paths()
        wrong = [name for name in wrong if name not in moved]
    return sorted(wrong)


def test_every_module_path_the_package_s_own_text_names_exists() -> None:
    """Docstrings and comments that send a reader to ``stores/skips.py`` or
    ``airflow_resumable.core.view.liveness_of`` send them somewhere real (a rename that left its
    old name in the text fails here)."""
    wrong = {str(f.relative_to(ROOT)): names for f in sorted(PACKAGE.rglob("*.py"))
             if (names := _misnamed(f, old_paths=f == PACKAGE / "core" / "_moved.py"))}
    assert not wrong, wrong


def test_every_module_path_the_changelog_s_unreleased_section_names_exists_or_is_a_moved_module_s_old_path(
        tmp_path: Path) -> None:
    """What the next release says moved, and where to, is what a user imports from: a new path that
    is not there (a rename undone after the entry was written) fails here."""
    text = (ROOT / "CHANGELOG.md").read_text()
    start = text.index("## [Unreleased]")
    section = tmp_path / "unreleased.md"
    section.write_text(text[start:text.index("\n## [", start + 1)])
    assert not _misnamed(section, old_paths=True)


def test_the_path_check_sees_a_name_that_went(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text('"""See ``stores/checkpoint_writes.py`` and airflow_resumable.core.view.no_such_name;\n'
                      'and stores/checkpoints.py, airflow_resumable.core.view.liveness_of."""\n')
    assert _misnamed(source) == ["airflow_resumable.core.view.no_such_name", "stores/checkpoint_writes.py"]


def test_the_path_check_sees_a_folder_that_went(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text('"""In ``core/runs/`` and airflow_resumable/core/lent; as core/attempt/ and '
                      'airflow_resumable/core/stores/transaction hold."""\n')
    assert _misnamed(source) == ["airflow_resumable/core/lent", "core/runs"]


def test_the_path_check_sees_a_moved_module_s_old_path_outside_the_text_about_the_move(tmp_path: Path) -> None:
    """``airflow_resumable.core.runner`` still imports (with a warning) but is no module of the package:
    the core's ``__init__`` only mentions the word. Named by the moved-modules map, it is the old path."""
    source = tmp_path / "m.py"
    source.write_text('"""See airflow_resumable.core.runner and ``chunks.py``; and airflow_resumable.core.attempt.runner."""\n')
    assert _misnamed(source) == ["airflow_resumable.core.runner", "chunks.py"]
    assert _misnamed(source, old_paths=True) == []


def _sends(source: str) -> list[int]:
    """The lines of ``source`` that send a statement or open a cursor (``x.execute(...)``,
    ``x.executemany(...)``, ``x.cursor()``)."""
    return sorted(node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Attribute) and node.func.attr in ("execute", "executemany", "cursor"))


def test_the_core_sends_statements_from_its_stores_and_readers_only() -> None:
    """The checkpoint database is written and read through ``core/stores/`` (``session.checkpoints``,
    ``session.plans``...), the user's source through ``core/readers/``: a statement built and sent
    anywhere else in the core is one the stores' rules (the fence, the request rules, the one
    decoder) never see. (Outside the core, the test kit's faults write hand-edited rows on purpose,
    and the Airflow layer reads Airflow's own metadata database.)"""
    allowed = (PACKAGE / "core" / "stores", PACKAGE / "core" / "readers")
    found = {str(f.relative_to(ROOT)): lines for f in sorted((PACKAGE / "core").rglob("*.py"))
             if not f.is_relative_to(allowed[0]) and not f.is_relative_to(allowed[1])
             and (lines := _sends(f.read_text()))}
    assert not found, found


_STATEMENT = re.compile(r"\b(?:SELECT\b.+\bFROM\s+\w|INSERT\s+INTO\s+\w|UPDATE\s+\w+\s+SET\b|DELETE\s+FROM\s+\w)", re.S)


def _statement_texts(source: str) -> list[int]:
    """The lines of ``source`` whose string literals (f-string parts too; docstrings aside) hold the
    text of a statement: ``SELECT ... FROM t``, ``INSERT INTO t``, ``UPDATE t SET``, ``DELETE FROM t``."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        else:
            continue
        if _STATEMENT.search(text):
            lines.add(node.lineno)
    return sorted(lines)


def test_the_core_holds_statement_text_in_its_stores_and_readers_only() -> None:
    """No statement's text is put together in the core outside ``core/stores/`` (the checkpoint
    database's, and the repair statements its decoder's errors hand a person) and ``core/readers/``
    (the user's source): not even one for a person to paste."""
    allowed = (PACKAGE / "core" / "stores", PACKAGE / "core" / "readers")
    found = {str(f.relative_to(ROOT)): lines for f in sorted((PACKAGE / "core").rglob("*.py"))
             if not f.is_relative_to(allowed[0]) and not f.is_relative_to(allowed[1])
             and (lines := _statement_texts(f.read_text()))}
    assert not found, found
    assert _statement_texts('"""UPDATE t SET a"""\nx = f"DELETE FROM {t} WHERE a"\ny = "UPDATE t SET a"\n') == [2, 3]


def test_the_statement_rule_sees_a_send() -> None:
    assert _sends("def f(s):\n    s.execute('SELECT 1')\n    c = s.conn.cursor()\n    s.checkpoints.load()\n") == [2, 3]
