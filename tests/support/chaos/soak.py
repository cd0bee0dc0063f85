"""``make soak MINUTES=30``: the chaos workloads' DAG runs back to back with random faults for the
given time, on one deployment, sampling once a minute what a leak would grow: each worker's and the
API server's memory (RSS), open files (file descriptors, sockets included) and threads, and the
connections held to the checkpoint database and to Airflow's metadata database.

A sample is taken between trials, when no DAG run is running (the first quiet moment after each
minute): a task's own processes and connections are gone then, so what is left is what the
long-lived processes hold. A worker's sample is its main process with its direct children (Celery's
pool processes, a LocalExecutor's worker processes), not the task processes they start.

The faults are the trials' kinds except those that replace a worker (``kill_worker``, ``deploy``,
``deploy_paused``): a new process's memory would start over and hide a leak. The soak fails on an
anomaly or an unsettled trial, and on growth beyond noise once the first :data:`WARM_UP` minutes
are over: a process's RSS more than :data:`RSS_GROWTH` above its sample at the end of the warm-up,
or its threads or open files, or the connections, above the most the warm-up saw; each judged on
the least of the last three samples, so one busy moment is not a trend. The samples, the report
and the curves (matplotlib) go to ``--out`` (``soak-<executor>.json``, ``.md``, ``.png``).

    PYTHONPATH=.:tests python -m support.chaos.soak --minutes 30 [--executor celery|local] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import psutil
import psycopg2

from devtools.postgres import Server
from support.chaos.cluster import Chaos, chaos_cluster
from support.chaos.hosts import netem_available, sweep
from support.chaos.report import markdown as trials_report
from support.chaos.report import results
from support.chaos.trials import Trial, run_trial
from support.chaos.verdicts import KINDS

#: Minutes before the samples are judged: caches, pools and lazily started threads fill up first.
WARM_UP = 5.0
#: The RSS growth after the warm-up that fails the soak.
RSS_GROWTH = 0.10
#: Seconds between samples.
INTERVAL = 60.0
#: The faults of the soak: none that replaces a worker process.
SOAK_KINDS = tuple(k for k in KINDS if k not in ("kill_worker", "deploy", "deploy_paused"))
MEASURES = ("rss_mb", "fds", "threads")


def _process_sample(component: Any) -> dict[str, Any] | None:
    """A component's main process and its direct children: pid, RSS (MB), open fds, threads."""
    if not component.alive():
        return None
    try:
        root = psutil.Process(component.pid)
        procs = [root, *root.children(recursive=False)]
        rss = fds = threads = 0
        for proc in procs:
            with proc.oneshot():
                rss += proc.memory_info().rss
                fds += proc.num_fds()
                threads += proc.num_threads()
    except psutil.Error:
        return None
    return {"pid": component.pid, "processes": len(procs), "rss_mb": round(rss / 2**20, 1), "fds": fds,
            "threads": threads}


def _connections(dsn: str, database: str) -> tuple[int, int]:
    """Connections held to ``database`` on the server of ``dsn`` (this sampler's own left out), and of
    those the ones whose task process is gone (named ``chaos-task:<pid>`` by the chaos DAGs)."""
    with closing(psycopg2.connect(dsn, connect_timeout=10)) as conn, conn.cursor() as cur:
        cur.execute("SELECT application_name FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                    (database,))
        names = [name for (name,) in cur.fetchall()]
    gone = [n for n in names if n.startswith("chaos-task:") and not psutil.pid_exists(int(n.split(":")[1]))]
    return len(names), len(gone)


def sample(chaos: Chaos, minute: float) -> dict[str, Any]:
    """One sample of every watched process and of the connections held."""
    cluster = chaos.cluster
    roles = [*sorted(cluster.WORKERS), "api-server"]
    checkpoint, gone = _connections(chaos.conn_uri, "chaos")
    return {
        "minute": round(minute, 2),
        "processes": {role: _process_sample(cluster.components[role]) for role in roles},
        "connections": {
            "checkpoint": checkpoint,
            "checkpoint, process gone": gone,
            "metadata": _connections(chaos.metadata_dsn, chaos.metadata_dsn.rsplit("/", 1)[1])[0],
        },
    }


def _series(samples: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Every measured curve, ``<role> <measure>`` or ``connections <database>``: (minute, value) of the
    role's last process (a restarted one's curve starts over)."""
    curves: dict[str, list[tuple[float, float]]] = {}
    roles = {role for s in samples for role in s["processes"]}
    for role in sorted(roles):
        seen = [(s["minute"], s["processes"][role]) for s in samples if s["processes"].get(role)]
        if not seen:
            continue
        last_pid = seen[-1][1]["pid"]
        for measure in MEASURES:
            curves[f"{role} {measure}"] = [(m, p[measure]) for m, p in seen if p["pid"] == last_pid]
    for database in samples[0]["connections"] if samples else ():
        curves[f"connections {database}"] = [(s["minute"], s["connections"].get(database, 0)) for s in samples]
    return curves


def judge(samples: list[dict[str, Any]], *, warm_up: float = WARM_UP) -> list[str]:
    """What grew beyond noise after the warm-up (empty: nothing), or why the samples cannot tell."""
    problems = []
    for name, curve in _series(samples).items():
        early = [v for m, v in curve if m <= warm_up]
        late = [v for m, v in curve if m > warm_up]
        if not early or len(late) < 3:
            problems.append(f"{name}: too few samples to judge ({len(early)} in the warm-up, {len(late)} after it; "
                            f"run more than {warm_up + 3:g} minutes)")
            continue
        level = min(late[-3:])  # what persisted at the end
        if name.endswith("rss_mb"):
            base = early[-1]
            if level > base * (1 + RSS_GROWTH):
                problems.append(f"{name}: {base:g} MB after the warm-up, {level:g} MB at the end "
                                f"(+{level / base - 1:.0%}, more than {RSS_GROWTH:.0%})")
        elif level > max(early):
            problems.append(f"{name}: at most {max(early):g} in the warm-up, {level:g} at the end")
    return problems


def plot(res: dict[str, Any], path: Path) -> None:
    """The curves, one panel per measure (matplotlib, PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = _series(res["samples"])
    panels = [("RSS (MB)", "rss_mb"), ("open files (fds)", "fds"), ("threads", "threads"),
              ("connections held", "connections")]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for ax, (title, key) in zip(axes.flat, panels, strict=True):
        for name, curve in curves.items():
            if (key == "connections" and name.startswith("connections")) or name.endswith(f" {key}"):
                label = name.replace(f" {key}", "") if key != "connections" else name.split(" ", 1)[1]
                ax.plot([m for m, _ in curve], [v for _, v in curve], marker=".", label=label)
        ax.axvline(res["warm_up"], color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("minutes")
    verdict = "passed" if res["passed"] else "FAILED"
    fig.suptitle(f"make soak MINUTES={res['minutes_asked']:g} ({res['executor']}): {len(res['trials'])} trials, "
                 f"{verdict}; dashed: end of the warm-up")
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def markdown(res: dict[str, Any]) -> str:
    """The soak's figures: per curve its value after the warm-up and at the end, and the verdict."""
    lines = ["| curve | start | end of warm-up | end | change after the warm-up |", "|---|---|---|---|---|"]
    for name, curve in _series(res["samples"]).items():
        early = [v for m, v in curve if m <= res["warm_up"]]
        base = early[-1] if early else curve[0][1]
        end = min(v for _, v in curve[-3:])
        change = f"{end / base - 1:+.0%}" if name.endswith("rss_mb") and base else f"{end - base:+g}"
        lines.append(f"| {name} | {curve[0][1]:g} | {base:g} | {end:g} | {change} |")
    verdict = "passed" if res["passed"] else "FAILED: " + "; ".join(res["problems"])
    lines += ["", f"{len(res['samples'])} samples over {res['minutes']:g} minutes, {len(res['trials'])} trials; "
              f"**{verdict}**"]
    return "\n".join(lines)


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # the cleanup in the finally blocks runs


def main() -> int:
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--executor", choices=("celery", "local"), default="celery")
    parser.add_argument("--first", type=int, help="the first trial's seed (default: a random one)")
    parser.add_argument("--interval", type=float, default=INTERVAL, help="seconds between samples")
    parser.add_argument("--redis-db", type=int, default=8, help="the broker's Redis database (flushed)")
    parser.add_argument("--out", type=Path, default=Path(".chaos"))
    args = parser.parse_args()
    seed = args.first if args.first is not None else random.randrange(10**6)
    print(f"soak: {args.minutes:g} minutes on {args.executor}, trials from seed {seed}, faults {', '.join(SOAK_KINDS)}",
          flush=True)
    sweep()
    netem = netem_available() is None
    server = Server().start()
    samples: list[dict[str, Any]] = []
    trials: list[Trial] = []
    try:
        with chaos_cluster(server.admin_dsn, redis_db=args.redis_db, executor=args.executor) as chaos:
            began = time.monotonic()
            end = began + args.minutes * 60
            while True:
                now = time.monotonic()
                if not samples or now - began >= len(samples) * args.interval:
                    samples.append(sample(chaos, (now - began) / 60))
                    print(f"sample at {samples[-1]['minute']:.1f} min: {json.dumps(samples[-1])}", flush=True)
                if now >= end:
                    break
                trial = run_trial(chaos, seed, netem=netem, kinds=SOAK_KINDS)
                trials.append(trial)
                print(trial.summary(), flush=True)
                seed += 1
            minutes = (time.monotonic() - began) / 60
    finally:
        server.stop()
    problems = judge(samples)
    anomalies = [f"seed {t.seed}: {a}" for t in trials for a in t.anomalies]
    unsettled = [f"seed {t.seed}: unsettled" for t in trials if t.unsettled]
    res = {
        "executor": args.executor, "minutes_asked": args.minutes, "minutes": round(minutes, 1), "warm_up": WARM_UP,
        "interval": args.interval, "samples": samples, "problems": problems + anomalies + unsettled,
        "passed": not (problems or anomalies or unsettled),
        "trials": results(trials, executor=args.executor, skipped={} if netem else {"netem": "no sch_netem"},
                          minutes=minutes)["trials"],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"soak-{args.executor}"
    stem.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    plot(res, stem.with_suffix(".png"))
    report = markdown(res) + "\n\nThe trials:\n\n" + trials_report(
        results(trials, executor=args.executor, skipped={}, minutes=minutes), verdict=False)
    stem.with_suffix(".md").write_text(report + "\n")
    print()
    print(report)
    print(f"\nthe samples: {stem.with_suffix('.json')}; the curves: {stem.with_suffix('.png')}; "
          f"the report: {stem.with_suffix('.md')}")
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
