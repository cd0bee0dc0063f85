"""The docs' snippet runner (``test_doc_snippets.py``) fails when a guide gains a snippet it neither
runs nor lists with a reason: tried on a copy of the docs with one snippet added, its first test
run on that copy (in a process of its own, as the test module stands: no test module imports
another).

Its table keys a snippet by (page, first line), and its pattern sees only ```python fences: a second
snippet that begins as a listed one does (``from datetime import timedelta``, the first line of
many a DAG file) and a ```py fence (Markdown renders it as Python too) went through unseen, never
run and never said why.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import ROOT, TESTS

BROKEN = "from datetime import timedelta\n\nthis is not Python(\n"


def _first_test_on(tmp_path: Path, page: str, added: str) -> subprocess.CompletedProcess[str]:
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copytree(ROOT / "dags", copy / "dags", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "tests" / "system").mkdir(parents=True)
    shutil.copytree(TESTS / "support", copy / "tests" / "support",
                    ignore=shutil.ignore_patterns("__pycache__", "chaos"))
    shutil.copy(TESTS / "system" / "test_doc_snippets.py", copy / "tests" / "system")
    target = copy / "docs" / page
    target.write_text(target.read_text() + "\n" + added)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--noconftest", "-q",
         str(copy / "tests" / "system" / "test_doc_snippets.py")
         + "::test_every_snippet_is_an_example_dag_s_code_runs_here_or_says_why_not"],
        capture_output=True, text=True, timeout=300, cwd=copy, env={"PATH": "/usr/bin:/bin",
                                                                     "PYTHONPATH": str(copy / "tests")})


def test_the_copy_as_it_is_passes(tmp_path: Path) -> None:
    done = _first_test_on(tmp_path, "guides/async.md", "")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.parametrize("added", [
    pytest.param(f"```python\n{BROKEN}```\n", id="same-first-line-as-a-run-snippet"),
    pytest.param(f"```py\n{BROKEN}```\n", id="py-fence"),
])
def test_a_new_broken_snippet_fails_the_runner(tmp_path: Path, added: str) -> None:
    done = _first_test_on(tmp_path, "guides/async.md", added)
    assert done.returncode != 0, "a broken snippet added to async.md passed the snippet runner unseen:\n" + done.stdout[-2000:]
