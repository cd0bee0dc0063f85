"""Hosts on this machine: network namespaces joined by veth pairs to one bridge on a private /24.

::

    root namespace (bridge <tag>-br, .1): scheduler, api-server, dag-processor, triggerer, Redis,
        the Airflow metadata database; TCP relays on .1 forward to their 127.0.0.1 ports
    <tag>-db  (.2):  a throwaway PostgreSQL cluster: checkpoints and sinks
    <tag>-w1  (.11): Celery worker ``worker-a``      <tag>-w2 (.12): Celery worker ``worker-b``

Nothing leaves the machine: the bridge has no uplink and no route to anything else. Every name
starts with ``rsc`` plus a per-run tag; :func:`sweep` removes what a crashed run left (namespaces,
links and processes of tags whose owner pid is gone), and :meth:`Network.close` removes this run's.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from devtools.postgres import _pg_bin

PREFIX = "rsc"
STATE_DIR = Path(tempfile.gettempdir()) / "resumable-chaos"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command (``ip``, ``tc``...); a failure names the command and what it said."""
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done


def in_ns(ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def _namespaces() -> list[str]:
    out = sh("ip", "-o", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _links() -> list[str]:
    out = sh("ip", "-o", "link", "show", check=False).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def _pids_in(ns: str) -> list[int]:
    return [int(p) for p in sh("ip", "netns", "pids", ns, check=False).stdout.split() if p.strip().isdigit()]


def _remove(tag: str) -> list[str]:
    """End the processes in the tag's namespaces, delete them and its links; returns what went."""
    gone: list[str] = []
    for ns in [n for n in _namespaces() if n.startswith(f"{tag}-")]:
        for pid in _pids_in(ns):
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while _pids_in(ns) and time.monotonic() < deadline:
            time.sleep(0.1)
        sh("ip", "netns", "del", ns, check=False)
        gone.append(ns)
    for link in [name for name in _links() if name.startswith(f"{tag}-")]:
        sh("ip", "link", "del", link, check=False)
        gone.append(link)
    state = STATE_DIR / tag
    if state.exists():
        for line in (state / "pids").read_text().split() if (state / "pids").exists() else []:
            pid, _, started = line.partition(":")
            try:
                proc = psutil.Process(int(pid))
                if f"{proc.create_time():.3f}" != started:
                    continue  # the pid was reused by a process this suite did not start
                for child in proc.children(recursive=True):
                    child.kill()
                proc.kill()
                gone.append(f"pid {pid}")
            except (psutil.Error, ValueError):
                pass
        shutil.rmtree(state, ignore_errors=True)
    return gone


def sweep() -> list[str]:
    """Remove what crashed runs left: tags whose owner (the pid in their state file) is gone, and
    namespaces or links with the prefix and no state file at all."""
    tags = {name.split("-")[0] for name in [*_namespaces(), *_links()] if name.startswith(PREFIX) and "-" in name}
    if STATE_DIR.exists():
        tags |= {p.name for p in STATE_DIR.iterdir() if p.name.startswith(PREFIX)}
    gone: list[str] = []
    for tag in sorted(tags):
        owner = STATE_DIR / tag / "owner"
        try:
            alive = psutil.pid_exists(int(owner.read_text()))
        except (OSError, ValueError):
            alive = False
        if not alive:
            gone += _remove(tag)
    return gone


@dataclass
class Host:
    """One namespace and its end of a veth pair."""

    name: str  # a short role name: db, w1, w2
    ns: str
    address: str
    inside: str  # the veth end in the namespace
    outside: str  # the end on the bridge

    def argv(self, *argv: str) -> list[str]:
        """``argv`` run on this host."""
        return in_ns(self.ns, *argv)


@dataclass
class Network:
    """The bridge, the hosts and the relays of one run; :meth:`close` removes all of them."""

    tag: str = field(default_factory=lambda: f"{PREFIX}{random.randrange(16**3):03x}")
    hosts: dict[str, Host] = field(default_factory=dict)
    relays: list[subprocess.Popen[bytes]] = field(default_factory=list)
    subnet: str = ""

    @property
    def gateway(self) -> str:
        return f"{self.subnet}.1"

    @property
    def bridge(self) -> str:
        return f"{self.tag}-br"

    def open(self, roles: dict[str, int]) -> Network:
        """The bridge on a free /24 of 10.77.0.0/16 and one host per role (role -> last octet)."""
        sweep()
        state = STATE_DIR / self.tag
        state.mkdir(parents=True, exist_ok=True)
        (state / "owner").write_text(str(os.getpid()))
        used = sh("ip", "-o", "-4", "addr", "show", check=False).stdout
        self.subnet = next(f"10.77.{n}" for n in random.sample(range(1, 255), 254) if f"10.77.{n}." not in used)
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for role, octet in roles.items():
            host = Host(role, f"{self.tag}-{role}", f"{self.subnet}.{octet}", f"{self.tag}-{role}-n",
                        f"{self.tag}-{role}-h")
            sh("ip", "netns", "add", host.ns)
            sh("ip", "link", "add", host.outside, "type", "veth", "peer", "name", host.inside)
            sh("ip", "link", "set", host.inside, "netns", host.ns)
            sh("ip", "link", "set", host.outside, "master", self.bridge)
            sh("ip", "link", "set", host.outside, "up")
            sh(*host.argv("ip", "addr", "add", f"{host.address}/24", "dev", host.inside))
            sh(*host.argv("ip", "link", "set", host.inside, "up"))
            sh(*host.argv("ip", "link", "set", "lo", "up"))
            self.hosts[role] = host
        return self

    def relay(self, port: int, target_port: int | None = None) -> None:
        """Forward ``gateway:port`` to ``127.0.0.1:target_port`` (services bound to loopback)."""
        proc = subprocess.Popen(
            ["socat", f"TCP-LISTEN:{port},bind={self.gateway},fork,reuseaddr", f"TCP:127.0.0.1:{target_port or port}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        self.relays.append(proc)
        self.remember(proc.pid)
        deadline = time.monotonic() + 10
        while f"{self.gateway}:{port} " not in sh("ss", "-ltnH", check=False).stdout:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the relay {self.gateway}:{port} -> 127.0.0.1:{target_port or port} did not start")
            time.sleep(0.05)

    def remember(self, pid: int) -> None:
        """Note a process of this run (with its start time, so a reused pid is never taken for
        it): :func:`sweep` ends it and its children if this run crashes without cleaning up."""
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:
            return
        with open(STATE_DIR / self.tag / "pids", "a") as f:
            f.write(f"{pid}:{started:.3f}\n")

    # -- faults on links ----------------------------------------------------------------------------

    def link(self, role: str, up: bool) -> None:
        """Cut (or restore) a host's only link: it loses the database, the broker and the API server."""
        host = self.hosts[role]
        sh(*host.argv("ip", "link", "set", host.inside, "up" if up else "down"))

    def partition(self, role: str, other: str, cut: bool) -> None:
        """Drop (or heal) the traffic between two hosts only, both ways (blackhole routes: packets to
        the other side vanish, TCP retransmits until healed, as across a broken switch)."""
        a, b = self.hosts[role], self.hosts[other]
        verb = "add" if cut else "del"
        sh(*a.argv("ip", "route", verb, "blackhole", f"{b.address}/32"), check=cut)
        sh(*b.argv("ip", "route", verb, "blackhole", f"{a.address}/32"), check=cut)

    def isolate(self, role: str, cut: bool) -> None:
        """Drop (or heal) a host's traffic to the root namespace only (a blackhole route to the bridge's
        address, where the relays listen): it loses Airflow (the API server, the broker, the metadata
        database) and keeps the other hosts, the checkpoint database among them."""
        host = self.hosts[role]
        sh(*host.argv("ip", "route", "add" if cut else "del", "blackhole", f"{self.gateway}/32"), check=cut)

    def close(self) -> None:
        for proc in self.relays:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        _remove(self.tag)


#: How :func:`netem_available` begins its answer when the kernel itself has no netem qdisc (built
#: without ``CONFIG_NET_SCH_NETEM``): nothing to install, the ``lossy`` fault's proxy brings the same
#: latency and loss. Any other answer is a tool or a permission missing, which CI fails on.
NO_KERNEL_NETEM = "the kernel has no sch_netem"


def netem_available() -> str | None:
    """None when ``tc qdisc ... netem`` works here, else why not (the latency/loss fault is skipped)."""
    ns = f"{PREFIX}probe{os.getpid() % 1000}"
    try:
        sh("ip", "netns", "add", ns)
        done = sh(*in_ns(ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "10ms"), check=False)
        if done.returncode == 0:
            return None
        unknown = "qdisc kind is unknown" in done.stderr
        return f"{NO_KERNEL_NETEM} ({done.stderr.strip()})" if unknown else f"tc netem failed: {done.stderr.strip()}"
    except (RuntimeError, FileNotFoundError) as exc:
        return str(exc)
    finally:
        sh("ip", "netns", "del", ns, check=False)


class HostPostgres:
    """A throwaway PostgreSQL cluster on a host of the network (listening on its address only),
    with commit timestamps on, so the checker can order the commits of different attempts, and TCP
    keepalives that end a vanished client's connection."""

    def __init__(self, host: Host, port: int = 5432):
        self.host, self.port = host, port
        self.dir = tempfile.mkdtemp(prefix="resumable-chaos-pg-")
        self.data = os.path.join(self.dir, "data")
        shutil.chown(self.dir, "postgres", "postgres")
        self._as = ["runuser", "-u", "postgres", "--"]
        self._lock = threading.Lock()

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://postgres@{self.host.address}:{self.port}/postgres"

    def _pg_ctl(self, *args: str) -> None:
        pg_ctl = _pg_bin("pg_ctl")
        assert pg_ctl, "PostgreSQL's pg_ctl is not installed"
        sh(*self.host.argv(*self._as, pg_ctl, "-D", self.data, *args))

    def start(self) -> HostPostgres:
        initdb = _pg_bin("initdb")
        assert initdb, "PostgreSQL's initdb is not installed"
        sh(*self._as, initdb, "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8")
        with open(os.path.join(self.data, "pg_hba.conf"), "a") as f:
            f.write(f"host all all {self.host.address.rsplit('.', 1)[0]}.0/24 trust\n")
        self._pg_ctl("-o", self._options(), "-l", os.path.join(self.dir, "log"), "-w", "-t", "60", "start")
        return self

    def _options(self) -> str:
        # TCP keepalives as a production server should have them: a client whose host vanished (its
        # link cut while its process died) leaves a half-open connection, ended here within ~25 s
        # instead of the kernel's two hours (the soak counts the connections held).
        return (f"-p {self.port} -k {self.dir} -c listen_addresses={self.host.address} -c fsync=off "
                "-c track_commit_timestamp=on -c max_connections=200 -c tcp_keepalives_idle=10 "
                "-c tcp_keepalives_interval=5 -c tcp_keepalives_count=3")

    def restart(self) -> None:
        """A fast restart: every connection is dropped, the server is back at once (one restart at
        a time: two at once make pg_ctl fail to start it)."""
        with self._lock:
            self._pg_ctl("-o", self._options(), "-l", os.path.join(self.dir, "log"), "-m", "fast", "-w", "-t", "60",
                         "restart")

    def ensure_running(self) -> None:
        """Start the server if a failed restart left it down."""
        pg_ctl = _pg_bin("pg_ctl")
        assert pg_ctl
        with self._lock:
            if sh(*self.host.argv(*self._as, pg_ctl, "-D", self.data, "status"), check=False).returncode != 0:
                self._pg_ctl("-o", self._options(), "-l", os.path.join(self.dir, "log"), "-w", "-t", "60", "start")

    def stop(self) -> None:
        try:
            self._pg_ctl("-m", "immediate", "stop")
        except (RuntimeError, AssertionError):
            pass
        shutil.rmtree(self.dir, ignore_errors=True)
