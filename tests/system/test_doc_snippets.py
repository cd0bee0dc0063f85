"""Every Python snippet of the docs runs as written, or the docs' tests say why it cannot.

A snippet quoted from an example DAG (``<!-- snippet: dags/FILE.py#NAME -->``) is that DAG's code
(``scripts/readme_snippets.py`` keeps them equal) and runs under ``dag.test()`` in
``test_example_dags.py``. Of the others, those that are whole programs run here: the import line
of the index, and async.md's first task under ``airflow dags test`` (its placeholder CRM,
``https://crm.example``, replaced by a local HTTP service with both endpoints, its only change).
Every other one is a fragment of the reader's own code (names it does not define, a ``...``, an
``await`` outside a function); :data:`CANNOT_RUN` says why for each, and a new snippet the table
does not know fails the first test until it runs here or says why not.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from support.paths import ROOT

DOCS = ROOT / "docs"
BLOCK = re.compile(r"(<!-- snippet: (?P<quoted>[^#\s]+)#[\w-]+ -->\n)?```python\n(?P<body>.*?)```", re.S)

#: (page, the snippet's first line) -> why it cannot run as written.
CANNOT_RUN = {
    ("explanation/pause.md", "from airflow_resumable import control"):
        "requests to a slot of the reader's own store (job and slot are examples); the same requests run "
        "on a test store in tests/unit/core/control/test_requests.py",
    ("explanation/pause.md", "def replica_lag(ctx):"):
        "a fragment: current_replica_lag_seconds and the handler export are the reader's",
    ("guides/async.md", "def write(ctx, rows):"):
        "a fragment of an async handler: await outside a function, rows and the sink table are the reader's",
    ("guides/incremental.md", "ChunkedOperator(..., start=lambda ctx: ctx.previous.position if ctx.previous else None)"):
        "a fragment: ... stands for the operator's other arguments",
    ("guides/skip-policy.md", "item = (7, date(2026, 1, 3), datetime(2026, 1, 3, 12, 30, tzinfo=timezone.utc), "
                              "Decimal(\"12.50\"),"):
        "values, not a program: an item and what a replay hands process for it",
    ("guides/test-kit.md", "from airflow_resumable.testing import check_resumable, check_chunked"):
        "test functions of the reader's project (export_orders, read_sink, read_loans... are theirs); the kit "
        "runs the same calls on the example DAGs in tests/unit/testing/test_kit.py",
    ("guides/test-kit.md", "check_chunked(read_orders, export_batch, chunk_size=500,"):
        "a fragment: read_orders, export_batch, read_export and empty_export are the reader's",
    ("guides/test-kit.md", "from airflow_resumable.testing import check_partitioned"):
        "a test function of the reader's project (orders_reader, export_batch... are theirs)",
    ("guides/test-kit.md", "def test_the_dag_resumes_after_a_crash(resumable_dag_test):"):
        "a test function of the reader's project: dag is theirs (the fixture runs in tests/unit/testing/)",
    ("how-to/openlineage.md", "def add_loans(ctx: RunContext, batch: list[Any]) -> None:"):
        "a fragment: its body is ..., the warehouse connection is the reader's",
    ("reference/context.md", "from sqlalchemy import column, insert, table"):
        "a chunk function of the reader's handler: it needs their sink table and a DataFrame",
}
#: The snippets that run here as written (see the tests below).
RUN_HERE = {
    ("index.md", "from airflow_resumable import ResumableOperator, ChunkedOperator, RunContext"),
    ("guides/async.md", "from datetime import timedelta"),
}


def snippets() -> Iterator[tuple[str, int, str, str, str | None]]:
    """(page, line, first line, body, the DAG file it quotes or None) of every ```python block."""
    for path in sorted(DOCS.rglob("*.md")):
        text = path.read_text()
        for m in BLOCK.finditer(text):
            body = m.group("body")
            line = text.count("\n", 0, m.start("body")) + 1
            yield str(path.relative_to(DOCS)), line, body.splitlines()[0], body, m.group("quoted")


def body_of(page: str, first: str) -> str:
    return next(body for p, _, f, body, _ in snippets() if (p, f) == (page, first))


def test_every_snippet_is_an_example_dag_s_code_runs_here_or_says_why_not() -> None:
    unknown, quoted = [], set()
    for page, line, first, _, dag_file in snippets():
        if dag_file is not None:
            assert (ROOT / dag_file).is_file() and dag_file.startswith("dags/"), (page, line, dag_file)
            quoted.add(dag_file)
        elif (page, first) not in CANNOT_RUN and (page, first) not in RUN_HERE:
            unknown.append(f"{page}:{line}: {first}")
    assert unknown == [], "run these here, or say in CANNOT_RUN why they cannot"
    # The table tells snippets apart by (page, first line): two alike would pass as one
    firsts = [(page, first) for page, _, first, _, dag_file in snippets() if dag_file is None]
    alike = sorted({key for key in firsts if firsts.count(key) > 1})
    assert alike == [], f"two snippets of a page begin alike (one would never run): {alike}"
    # A Python block fenced otherwise (```py, ~~~python) renders as Python but BLOCK would not see it
    unseen = [f"{path.relative_to(DOCS)}: {fence.strip()}" for path in sorted(DOCS.rglob("*.md"))
              for fence in re.findall(r"^[ \t]*(?:```|~~~)[ \t]*\{?\.?[\w+.-]+", path.read_text(), re.M)
              if re.sub(r"^[ \t]*(?:```|~~~)[ \t]*\{?\.?", "", fence).lower().startswith("py")
              and fence.strip() != "```python"]
    assert unseen == [], f"fence these ```python: {unseen}"
    keys = {(page, first) for page, _, first, _, dag_file in snippets() if dag_file is None}
    assert sorted(set(CANNOT_RUN) | RUN_HERE) == sorted(keys), "CANNOT_RUN or RUN_HERE names a snippet no page has"
    assert quoted, "the guides quote the example DAGs"


def test_the_index_s_import_line_runs() -> None:
    body = body_of("index.md", "from airflow_resumable import ResumableOperator, ChunkedOperator, RunContext")
    done = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]


class _Crm(ThreadingHTTPServer):
    """``GET /customers?after=&limit=`` (1,000 customers) and ``POST /export`` (counted by id)."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self) -> None:
        self.sent: dict[int, int] = {}
        self.lock = threading.Lock()
        crm = self

        class Endpoints(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                query = parse_qs(urlparse(self.path).query)
                after, limit = int(query["after"][0]), int(query["limit"][0])
                self._reply([{"id": i} for i in range(after + 1, min(after + limit, 1_000) + 1)])

            def do_POST(self) -> None:  # noqa: N802
                customer = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with crm.lock:
                    crm.sent[customer["id"]] = crm.sent.get(customer["id"], 0) + 1
                self._reply({"ok": True})

        super().__init__(("127.0.0.1", 0), Endpoints)


def test_the_async_guide_s_first_task_runs_under_airflow_dags_test(airflow_home: Path, tmp_path: Path) -> None:
    """async.md's first snippet, as written but for its placeholder CRM's address, in a DAG of its own
    under ``airflow dags test`` with the embedded store: it sends every customer once and ends."""
    body = body_of("guides/async.md", "from datetime import timedelta")
    crm = _Crm()
    threading.Thread(target=crm.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        assert body.count('"https://crm.example"') == 1
        (tmp_path / "dags").mkdir()
        dag_file = tmp_path / "dags" / "async_guide.py"
        dag_file.write_text(
            body.replace('"https://crm.example"', f'"http://127.0.0.1:{crm.server_address[1]}"')
            + "\n\nfrom datetime import datetime, timezone\n\nfrom airflow.sdk import DAG\n\n"
            "with DAG(dag_id='async_guide', schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc)):\n"
            "    export_customers()\n"
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT), "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "dags"),
               "AIRFLOW_CONN_RESUMABLE_DEFAULT": f"sqlite:///{tmp_path / 'ck.db'}"}
        done = subprocess.run([str(Path(sys.executable).parent / "airflow"), "dags", "test", "async_guide",
                               "-f", str(dag_file)], capture_output=True, text=True, timeout=600, env=env,
                              cwd=tmp_path)
    finally:
        crm.shutdown()
        crm.server_close()
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    assert re.search(r"DagRun Finished: dag_id=async_guide,.* state=success", out), out[-3000:]
    assert sorted(crm.sent) == list(range(1, 1_001)) and set(crm.sent.values()) == {1}, out[-3000:]

