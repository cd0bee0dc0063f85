"""A TCP proxy on a worker's host, between the worker and the checkpoint database: the ``lossy``
fault's latency and loss where the kernel has no ``sch_netem`` (and no iptables ``statistic``).

Every connection the worker's task processes open to the checkpoint database goes through it
(their connection names ``127.0.0.1:<port>`` on their own host). Normally it forwards at once. The
fault writes a control file; while it says so, each piece of data waits ``delay`` +- ``jitter``
seconds before it is forwarded, and with probability ``loss`` a retransmission timeout more
(``rto``: what a lost segment costs a TCP connection: the application sees loss as a stall, never as
missing bytes), and with probability ``stall`` the connection hangs ``stall_for`` seconds. Order is
kept per direction. Its connection to the database gives up as the task's own would (the
connection's ``tcp_user_timeout``, ``TCP_USER_TIMEOUT`` seconds, on the proxy's upstream socket) and
then closes the task's: a cut link fails the task's statements instead of stalling them.
Self-contained (run by path, on the host: ``ip netns exec ... python proxy.py``).

    python proxy.py LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT CONTROL_FILE [TCP_USER_TIMEOUT]
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import sys
import time

SETTINGS: dict[str, float] = {}


async def _watch(control: str) -> None:
    seen = None
    while True:
        try:
            stamp = os.stat(control).st_mtime_ns
        except FileNotFoundError:
            stamp = None
        if stamp != seen:
            seen = stamp
            try:
                with open(control) as f:
                    SETTINGS.clear()
                    SETTINGS.update(json.load(f))
            except (OSError, ValueError):
                SETTINGS.clear()
        await asyncio.sleep(0.1)


def _hold() -> float:
    """How long the next piece of data waits (0 when the link is healthy)."""
    if not SETTINGS.get("on"):
        return 0.0
    wait = max(0.0, SETTINGS.get("delay", 0.0) + random.uniform(-1, 1) * SETTINGS.get("jitter", 0.0))
    if random.random() < SETTINGS.get("loss", 0.0):
        wait += SETTINGS.get("rto", 1.0)
    if random.random() < SETTINGS.get("stall", 0.0):
        wait += SETTINGS.get("stall_for", 3.0)
    return wait


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    due = 0.0  # pieces leave in order: each no sooner than the one before
    try:
        while data := await reader.read(65536):
            due = max(due, time.monotonic()) + _hold() if SETTINGS.get("on") else time.monotonic()
            if (left := due - time.monotonic()) > 0:
                await asyncio.sleep(left)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except (ConnectionError, OSError):
            pass


async def main(listen: int, host: str, port: int, control: str, user_timeout: float = 0.0) -> None:
    async def serve(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=30)
        except (TimeoutError, OSError):
            client_w.close()
            return
        if user_timeout:
            upstream = server_w.get_extra_info("socket")
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(user_timeout * 1000))
        await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))

    asyncio.ensure_future(_watch(control))
    server = await asyncio.start_server(serve, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4],
                     float(sys.argv[5]) if len(sys.argv) > 5 else 0.0))
