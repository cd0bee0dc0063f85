"""The package's layout, read from its own imports: rooms, their floors, and the rules the lint test holds.

A *room* is one folder of the core (``core/attempt/``, ``core/model/`` ...), ``core/view.py``, or one
module or folder of the Airflow layer (``operators/``, ``control.py`` ...). A room stands one floor above
the highest room it imports; type-only imports count. ``python -m devtools.layout`` prints the map
(``docs/contributing.md`` holds it between its markers, checked by ``tests/unit/test_layout.py``).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "airflow_resumable"

#: An Airflow-layer module may carry the name of the core room it is the face of, and only that one.
FACES = {"readers": "core.readers", "control": "core.control"}


@dataclass(frozen=True)
class Module:
    name: str  # dotted, "airflow_resumable.core.attempt.runner"
    path: Path
    lines: int
    doc: str  # the first paragraph of its docstring

    @property
    def room(self) -> str:
        """``core/attempt``, ``core/view.py``, ``operators``, ``control.py``, ``__init__.py`` ..."""
        parts = self.path.relative_to(PACKAGE).parts
        if parts[0] == "core" and len(parts) > 2:
            return f"core/{parts[1]}"
        if parts[0] == "core":
            return f"core/{parts[1]}" if parts[1] != "__init__.py" else "core/__init__.py"
        return parts[0]


def modules() -> dict[str, Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        text = path.read_text()
        doc = ast.get_docstring(ast.parse(text)) or ""
        found[name] = Module(name, path, len(text.splitlines()), doc.strip().split("\n\n")[0])
    return found


def absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` takes from, dotted: a relative one (``from ..x import y``)
    resolved against ``package``, the importing file's own package. The tests' import rule reads
    relative imports by it too."""
    base = node.module or ""
    if not node.level:
        return base
    parts = package.split(".") if package else []
    up = parts[: len(parts) - node.level + 1]
    return ".".join([*up, base] if base else up)


def imports(module: Module, known: dict[str, Module]) -> Iterator[tuple[str, int]]:
    """The package's modules that importing ``module`` runs directly (anywhere in it, type-only
    too), each with its line: every module it names, and for ``from x import y`` the module ``x``
    itself (a package's ``__init__`` runs before ``y``). The module's own packages are left out:
    they run before it anyway. The one reading of imports: the layout's rooms and the no-circle
    test (:func:`module_graph`) both take it."""
    package = module.name if module.path.name == "__init__.py" else module.name.rpartition(".")[0]
    for node in ast.walk(ast.parse(module.path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node, package)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in dict.fromkeys(targets):
            while target and target not in known:  # a name imported from a module: the module
                target = target.rpartition(".")[0]
            if target and target != module.name and not module.name.startswith(target + "."):
                yield target, node.lineno


def module_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (:func:`imports`), type-only imports included."""
    known = modules()
    return {name: {target for target, _ in imports(module, known)} for name, module in known.items()}


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of nodes that import each other, directly or around a loop (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                found.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def room_graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str, int]]]:
    """Room -> the rooms it imports, and every import between two rooms: (from room, to room, module, line).
    A package's ``__init__`` (its face) is left out: it imports from below by design."""
    known = modules()
    graph: dict[str, set[str]] = {}
    edges = []
    for module in known.values():
        if module.path.name == "__init__.py" and module.room not in ("core/control",):
            if module.path.parent in (PACKAGE, PACKAGE / "core"):
                continue
        graph.setdefault(module.room, set())
        for target, line in imports(module, known):
            other = known[target]
            if other.path.name == "__init__.py" and other.path.parent in (PACKAGE, PACKAGE / "core"):
                continue  # the package's face: the names are defined below it
            if other.room != module.room:
                graph[module.room].add(other.room)
                graph.setdefault(other.room, set())
                edges.append((module.room, other.room, module.name, line))
    return graph, edges


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each room's floor: 1 for a room that imports no other, else one above the highest it imports.
    Raises ValueError on a circle between rooms (an import running back up)."""
    floor: dict[str, int] = {}
    visiting: set[str] = set()

    def visit(room: str, trail: tuple[str, ...]) -> int:
        if room in floor:
            return floor[room]
        if room in visiting:
            raise ValueError("rooms that import each other: " + " -> ".join((*trail, room)))
        visiting.add(room)
        floor[room] = 1 + max((visit(other, (*trail, room)) for other in graph[room]), default=0)
        visiting.discard(room)
        return floor[room]

    for room in sorted(graph):
        visit(room, ())
    return floor


def summary(doc: str, limit: int = 110) -> str:
    """A docstring's first sentence, cut to ``limit`` characters (what the map says of a module)."""
    text = re.sub(r":\w+:`~?(?:[\w.]+\.)?([\w]+)`", r"`\1`", " ".join(doc.split())).replace("``", "`")
    first = text.split(". ")[0].rstrip(".")
    if len(first) > limit:
        first = first[: limit - 3].rsplit(" ", 1)[0]
        if first.count("`") % 2:
            first = first[: first.rindex("`")].rstrip()
        first = first.rstrip(",;:") + "..."
    return first


def render() -> str:
    """The map: every room from the top floor down, each with its modules and the first sentence of each one's
    docstring (the map in docs/contributing.md is this text, checked by a test)."""
    known = {name: m for name, m in modules().items()}
    graph, _ = room_graph()
    floor = floors(graph)
    rooms: dict[str, list[Module]] = {}
    for m in known.values():
        rooms.setdefault(m.room, []).append(m)
    out = []
    for room in sorted(rooms, key=lambda r: (-floor.get(r, 0), r)):
        members = sorted(rooms[room], key=lambda m: str(m.path))
        where = f"floor {floor[room]}" if room in floor else "the face"
        if room.endswith(".py"):
            (m,) = members
            out.append(f"- `{room}` ({where}): {summary(m.doc)}")
            continue
        face = next((m for m in members if m.path.parent == PACKAGE / room and m.path.name == "__init__.py"), None)
        out.append(f"- `{room}/` ({where})" + (f": {summary(face.doc)}" if face and face.doc else ""))
        for m in members:
            if m is face:
                continue
            rel = m.path.relative_to(PACKAGE / room)
            out.append(f"    - `{rel}`: {summary(m.doc)}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
