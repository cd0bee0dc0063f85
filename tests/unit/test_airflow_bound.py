"""``make matrix``'s selection on a pair that differs from ``make test``'s only in Airflow's version:
the core's tests that cannot reach Airflow are left out, and every test that can is kept, whether it
imports Airflow itself, through a module of ours, inside a function, or through a fixture."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.paths import TESTS
from support.pins import pins

FILES = {
    "conftest.py": (
        "import pytest\n"
        "import helpers\n\n"
        "@pytest.fixture\n"
        "def plain():\n    return 1\n\n"
        "@pytest.fixture\n"
        "def with_dag():\n    return helpers.dag_maker()\n"
    ),
    "helpers.py": "def dag_maker():\n    from airflow.sdk import DAG\n    return DAG\n\ndef pure():\n    return 2\n",
    "core/__init__.py": "",
    "core/test_free.py": "import json\n\ndef test_free(plain):\n    assert json.dumps(plain)\n",
    "core/test_direct.py": "import airflow  # noqa: F401\n\ndef test_direct():\n    pass\n",
    "core/test_lazy.py": "import helpers\n\ndef test_lazy():\n    helpers.pure()\n",
    "core/test_fixture.py": "def test_fixture(with_dag):\n    pass\n",
    "other/__init__.py": "",
    "other/test_outside.py": "def test_outside():\n    pass\n",
}


def test_the_core_s_tests_that_cannot_reach_airflow_are_left_out_and_every_other_kept(tmp_path: Path) -> None:
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{tmp_path}"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "support.airflow_bound",
         "--skip-airflow-free", "core", "--collect-only", "-q", "--rootdir", str(tmp_path), "-c", os.devnull],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    collected = sorted(line.split("::")[1] for line in out.stdout.splitlines() if "::" in line)
    # test_lazy reaches Airflow only through an import inside helpers.dag_maker's body
    assert collected == ["test_direct", "test_fixture", "test_lazy", "test_outside"], out.stdout + out.stderr
    assert "1 deselected" in out.stdout, out.stdout


def test_the_airflow_minors_pins_on_one_python_agree_on_every_library_the_core_imports() -> None:
    """What makes leaving those tests out sound: the core's own imports resolve to the same versions
    under every Airflow minor's constraints of one Python."""
    import ast
    import importlib.metadata
    import re

    root = TESTS.parent
    names: set[str] = set()
    for source in (root / "airflow_resumable" / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    providers = importlib.metadata.packages_distributions()
    used = {re.sub(r"[-_.]+", "-", d).lower() for name in names for d in providers.get(name, ())}
    assert {"psycopg2-binary", "pglast"} <= used, used

    by_python: dict[str, list[Path]] = {}
    for path in sorted((root / "constraints").glob("airflow-*-py*.txt")):
        by_python.setdefault(path.stem.rsplit("-py", 1)[1], []).append(path)
    compared = 0
    for files in by_python.values():
        first = pins(files[0])
        for other in files[1:]:
            theirs = pins(other)
            differ = {n for n in used if first.get(n) != theirs.get(n)}
            assert not differ, f"{files[0].name} and {other.name} pin {sorted(differ)} apart"
            compared += 1
    assert compared >= 2


SHARED = {
    "conftest.py": (
        "import pytest\n\n"
        "def pytest_collection_modifyitems(items):\n"
        "    for item in items:\n"
        "        if '/core/' in str(item.path):\n"
        "            item.add_marker(pytest.mark.core)\n"
    ),
    "core/__init__.py": "",
    "core/test_logic.py": "".join(f"def test_core_{i}():\n    pass\n\n" for i in range(5)),
    "other/__init__.py": "",
    "other/test_layer.py": "".join(f"def test_layer_{i}():\n    pass\n\n" for i in range(40)),
}


def test_the_pairs_that_share_a_suite_run_every_test_once_between_them(tmp_path: Path) -> None:
    for name, text in SHARED.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{tmp_path}"}
    shares = []
    for share in ("1/3", "2/3", "3/3"):
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "support.share", f"--share={share}",
             "--collect-only", "-q", "--rootdir", str(tmp_path), "-c", os.devnull],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        shares.append({line.split("::")[1] for line in out.stdout.splitlines() if "::" in line})
    every = sorted(t for share in shares for t in share)
    assert every == sorted([f"test_core_{i}" for i in range(5)] + [f"test_layer_{i}" for i in range(40)])
    assert all(shares), shares  # each pair has a share (45 tests in 3: none empty)


def test_make_test_s_module_shares_run_every_test_once_and_keep_each_module_in_one_process(tmp_path: Path) -> None:
    for name, text in SHARED.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for i in range(6):
        (tmp_path / "other" / f"test_more_{i}.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{tmp_path}"}
    runs = []
    for modules in ("3,4,5/5", "1,2/5"):  # scripts/test.sh's fast and fast-2
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "support.share", f"--modules={modules}",
             "--collect-only", "-q", "--rootdir", str(tmp_path), "-c", os.devnull],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        runs.append([line for line in out.stdout.splitlines() if "::" in line])
    every = sorted(runs[0] + runs[1])
    assert len(every) == len(set(every)) == 5 + 40 + 12, every
    assert all(runs), runs
    files = [{line.split("::")[0] for line in run} for run in runs]
    assert not files[0] & files[1]
