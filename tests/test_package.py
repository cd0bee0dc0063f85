"""The package's boundaries and registration, and the demo's figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_core_imports_no_airflow() -> None:
    code = (
        "import sys, airflow_resumable, airflow_resumable.core, airflow_resumable.core.runner\n"
        "from airflow_resumable import RunContext, Signal, Checkpoint\n"
        "leaked = sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.'))\n"
        "assert not leaked, leaked\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_no_core_module_mentions_airflow_imports() -> None:
    for path in (ROOT / "airflow_resumable" / "core").rglob("*.py"):
        text = path.read_text()
        assert "import airflow" not in text and "from airflow " not in text and "from airflow." not in text, path


def test_each_reader_name_is_one_object_under_its_module_and_both_public_paths() -> None:
    """core/readers/ is split one module a part; airflow_resumable.core.readers.X and
    airflow_resumable.readers.X stay the import paths users write."""
    from airflow_resumable import readers as public
    from airflow_resumable.core import readers as core
    from airflow_resumable.core.readers import base, file, keys, keyset, sequence, sql

    homes = {"Batch": base, "Reader": base, "KeysetReader": keyset, "FileReader": file, "FORMATS": file,
             "SequenceReader": sequence, "json_key": keys, "placeholders": sql}
    for name, home in homes.items():
        assert getattr(core, name) is getattr(home, name), name
        if name in public.__all__:
            assert getattr(public, name) is getattr(home, name), name
    assert {"Batch", "FileReader", "KeysetReader", "Reader", "SequenceReader", "json_key"} <= set(public.__all__)


def test_the_provider_registers_the_task_decorator() -> None:
    code = (
        "from airflow.sdk import task\n"
        "from airflow_resumable.decorators.resumable import resumable_task\n"
        "assert task.resumable is resumable_task or task.resumable.__name__ == 'resumable_task'\n"
        "from importlib.metadata import entry_points\n"
        "eps = [e for e in entry_points(group='apache_airflow_provider') if e.value.startswith('airflow_resumable')]\n"
        "info = eps[0].load()()\n"
        "assert info['package-name'] == 'airflow-resumable', info\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_public_api_names(airflow_home: Path) -> None:
    from airflow_resumable import ChunkedOperator, ResumableOperator, RunContext

    assert issubclass(ChunkedOperator, ResumableOperator) and RunContext.__name__ == "RunContext"


def test_make_demo_prints_the_lesson_s_figures(tmp_path: Path) -> None:
    """The README's first command, on the embedded default, in a fresh Airflow home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(tmp_path / "home")
    env["PY"] = sys.executable
    result = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh")], capture_output=True, text=True, env=env, timeout=300)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    lines = [line.strip() for line in out.splitlines()]
    first = lines.index("--- first run: cancelled at %40 ---")
    progress = [line for line in lines if line.startswith("progress %")]
    assert progress == [f"progress %{p} processed={p * 300}" for p in range(10, 101, 10)]
    assert "cancelled: user cancelled processed=12000/30000 total=174000" in lines
    assert "resumed from position=12000 on attempt 2" in lines
    assert lines[-2:] == ["done: total=435000 average days=14.50", lines[-1]] and lines[-1].endswith(": success")
    assert first < lines.index("--- second run: continues from where it was left ---")
