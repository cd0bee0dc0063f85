"""Async customer export: 1,000 customers sent to an HTTP API, 50 requests at once, resumable.

The export reads the customers from a small CRM service over HTTP (``GET /customers?after=&limit=``,
200 a page) and sends each one to the warehouse's API (``POST /export``), with ``httpx.AsyncClient``
and up to **50 requests in flight** (``ctx.map``). Both endpoints are served by a tiny local HTTP
service the task starts for itself (:func:`crm_service`): the example runs with nothing else
installed. It writes the exported customers to a SQLite file (``ASYNC_EXPORT_SINK``, default
``<tmp>/async_export_sink.db``), upserting by id and counting how often each one was sent.

**Resumable.** The requests finish in any order; the checkpoint saves the **contiguous low-water
mark**, the id before which every customer was sent. An interruption (a deploy, the timeout, a
pause or cancel from the UI or CLI) cancels the requests in flight at once, saves the mark and
stops; the retry continues after the mark. At most the window (50 requests plus the 50 sent since
the last save) is sent again, never a customer skipped: the API's upsert makes a repeat harmless.

**Watching it.** Trigger it with ``latency_ms`` set to 3000: each request then takes 3 s, so the
1,000 customers (20 rounds of 50 requests at once) take about a minute, time enough to open the
task's **Checkpoint** tab (its percent and ETA: the task knows the total) and press **Pause**, then
**Resume**, or mark it failed and Clear it, and read the log: ``attempt 2: resuming from position=...``.
At the default 5 ms the whole run takes seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from airflow.sdk import DAG, Param

from airflow_resumable import ResumableOperator, RunContext

CUSTOMERS = 1_000
PAGE = 200
IN_FLIGHT = 50


def sink_path() -> str:
    """The SQLite file the warehouse API writes to."""
    return os.environ.get("ASYNC_EXPORT_SINK") or os.path.join(tempfile.gettempdir(), "async_export_sink.db")


@contextlib.asynccontextmanager
async def crm_service(sink: str, *, customers: int, latency_ms: float) -> AsyncIterator[str]:
    """A local HTTP service with both endpoints, on a free port, for the time of the block; yields its URL."""
    db = sqlite3.connect(sink, timeout=30, check_same_thread=False, isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS exported (id INTEGER PRIMARY KEY, name TEXT NOT NULL, sent INTEGER NOT NULL)")
    writing = threading.Lock()  # one connection for the service's threads, one write at a time

    class Endpoints(BaseHTTPRequestHandler):
        timeout = 60  # a request whose client went silent ends: closing the service waits for every request

        def log_message(self, *args: Any) -> None:  # quiet: the task log is the export's
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
            after, limit = int(query.get("after", ["0"])[0]), int(query.get("limit", [str(PAGE)])[0])
            ids = range(after + 1, min(after + limit, customers) + 1)
            self._reply([{"id": i, "name": f"customer {i}"} for i in ids])

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers["Content-Length"])
            body = self.rfile.read(length)
            if len(body) < length:  # the export cancelled the request before its body was sent: no write
                return
            customer = json.loads(body)
            time.sleep(latency_ms / 1000)  # the API's own work
            with writing:
                db.execute("INSERT INTO exported (id, name, sent) VALUES (?, ?, 1) ON CONFLICT (id) DO UPDATE "
                           "SET name = excluded.name, sent = sent + 1", (customer["id"], customer["name"]))
            self._reply({"ok": True})

    class Server(ThreadingHTTPServer):
        request_queue_size = 128  # 50 connections at once: more than the default backlog of 5
        # server_close() waits for the requests still running: a request the export cancelled goes on
        # here until it has written, and the connection must not be closed under it.
        daemon_threads = False
        block_on_close = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            if not isinstance(sys.exc_info()[1], ConnectionError):  # a request the export cancelled: no reply
                super().handle_error(request, client_address)

    def stop() -> None:
        server.shutdown()
        server.server_close()  # every request has ended: none uses the connection any more
        db.close()

    server = Server(("127.0.0.1", 0), Endpoints)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        # One call on a thread: it runs to its end even when this await is cancelled (a stop source).
        await asyncio.to_thread(stop)


# [START async_export_handler]
async def export_customers(ctx: RunContext, *, latency_ms: float = 5, customers: int = CUSTOMERS,
                           sink: str | None = None) -> dict[str, int]:
    import httpx

    async with crm_service(sink or sink_path(), customers=customers, latency_ms=float(latency_ms)) as url, \
            httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def export_one(customer: dict[str, Any]) -> None:
            (await client.post("/export", json=customer)).raise_for_status()

        if ctx.total is None:
            ctx.total = customers  # the CRM's count: the Checkpoint tab shows a percent and an ETA
        while True:
            after = ctx.position or 0  # the last customer id before which every one was sent
            page = (await client.get("/customers", params={"after": after, "limit": PAGE})).json()
            if not page:
                return {"exported": ctx.processed}
            # Up to 50 requests at once; saves the low-water mark as they finish, in any order.
            await ctx.map(page, export_one, limit=IN_FLIGHT)
# [END async_export_handler]


with DAG(
    dag_id="async_export",
    schedule=None,  # trigger it from the UI
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    tags=["resumable", "example"],
    doc_md=__doc__,
    params={
        "latency_ms": Param(5, type="number", minimum=0, maximum=5000,
                            description="How long the API takes for each customer, 50 at once (3000: about a "
                            "minute for the 1,000 customers, time to press Pause on the Checkpoint tab)"),
    },
) as dag:
    ResumableOperator(
        task_id="export_customers",
        handler=export_customers,
        handler_kwargs={"latency_ms": "{{ params.latency_ms }}"},
        lease=15,  # a pause or cancel is read at the next checkpoint or heartbeat (every 5 s)
        timeout=timedelta(minutes=30),
        retries=2,
        retry_delay=timedelta(seconds=5),
    )
