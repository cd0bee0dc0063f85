"""The report of a chaos run: what was proven, per fault kind, from plain results (JSON) so the docs
can draw the same tables from a kept file.

A run passes when no trial has an anomaly or is unsettled and at least
:data:`~.verdicts.HIT_RATE` of its faults hit; every failing seed and every seed with a fault that
did not hit is listed with the command that replays it.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from support.chaos.moments import MOMENTS
from support.chaos.verdicts import HIT_RATE, KINDS

REPLAY = "make chaos SEED={seed} EXECUTOR={executor}"
VERDICTS = ("hit", "missed", "unconfirmed", "failed")


def results(trials: Iterable[Any], *, executor: str, skipped: dict[str, str], minutes: float,
            replay: str = REPLAY) -> dict[str, Any]:
    """The run's results as plain JSON: per trial its seed, time, counts, anomalies and each fault's verdict."""
    return {
        "executor": executor,
        "minutes": round(minutes, 1),
        "skipped": skipped,
        "replay": replay,
        "trials": [{
            "seed": t.seed,
            "seconds": round(t.seconds, 1),
            "counts": dict(t.counts),
            "anomalies": [str(a) for a in t.anomalies],
            "unsettled": list(t.unsettled),
            "shots": [{"kind": s.fault.kind, "moment": s.fault.moment, "k": s.fault.k, "verdict": s.verdict,
                       "victim": str(s.victim) if s.victim else None, "why": s.why, "note": s.note}
                      for s in t.shots],
        } for t in trials],
    }


def passed(res: dict[str, Any]) -> tuple[bool, str]:
    """Whether the run proves what it should, and why not."""
    trials = res["trials"]
    shots = [s for t in trials for s in t["shots"]]
    hits = sum(s["verdict"] == "hit" for s in shots)
    rate = hits / len(shots) if shots else 0.0
    why = []
    if not trials:
        why.append("no trial ran")
    if bad := [t["seed"] for t in trials if t["anomalies"]]:
        why.append(f"anomalies in seeds {bad}")
    if bad := [t["seed"] for t in trials if t["unsettled"]]:
        why.append(f"unsettled seeds {bad}")
    if rate < HIT_RATE:
        why.append(f"{hits} of {len(shots)} faults hit ({rate:.0%}), fewer than {HIT_RATE:.0%}")
    return not why, "; ".join(why)


def _rate(hits: int, total: int) -> str:
    return f"{hits / total:.0%}" if total else "-"


def markdown(res: dict[str, Any], *, verdict: bool = True) -> str:
    """The run's tables: the totals, then per fault kind, then (``verdict``) whether the run passed
    and the seeds to replay."""
    trials = res["trials"]
    shots = [s for t in trials for s in t["shots"]]
    verdicts = Counter(s["verdict"] for s in shots)
    counts = sum((Counter(t["counts"]) for t in trials), Counter[str]())
    per_trial = sorted(t["counts"].get("interruptions", 0) for t in trials) or [0]
    seconds = sorted(t["seconds"] for t in trials) or [0.0]
    lines = [
        "| trials | faults | hit | missed | fired, not confirmed | not injected | hit rate | interruptions "
        "(per trial: median, min-max) | items | repeated writes (plain) | stale plain writes | anomalies | unsettled "
        "| seconds per trial (median, max) | minutes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {len(trials)} | {len(shots)} | {verdicts['hit']} | {verdicts['missed']} | {verdicts['unconfirmed']} | "
        f"{verdicts['failed']} | {_rate(verdicts['hit'], len(shots))} | {counts['interruptions']} "
        f"({statistics.median(per_trial):g}, {per_trial[0]}-{per_trial[-1]}) | {counts['items']} | "
        f"{counts['repeated']} | {counts['stale plain writes']} | {sum(len(t['anomalies']) for t in trials)} | "
        f"{sum(1 for t in trials if t['unsettled'])} | {statistics.median(seconds):.0f}, {seconds[-1]:.0f} | "
        f"{res['minutes']:g} |",
        "",
        "| fault | faults | hit | missed | fired, not confirmed | not injected | hit rate | hits by moment |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        mine = [s for s in shots if s["kind"] == kind]
        v = Counter(s["verdict"] for s in mine)
        moments = Counter(s["moment"] for s in mine)
        hit_at = Counter(s["moment"] for s in mine if s["verdict"] == "hit")
        by_moment = ", ".join(f"{m} {hit_at[m]}/{moments[m]}" for m in MOMENTS if moments[m]) or "-"
        skipped = f" (skipped: {res['skipped'][kind].split(' (')[0]})" if kind in res["skipped"] else ""
        lines.append(f"| {kind}{skipped} | {len(mine)} | {v['hit']} | {v['missed']} | {v['unconfirmed']} | "
                     f"{v['failed']} | {_rate(v['hit'], len(mine))} | {by_moment} |")
    replay = res["replay"]
    failing = [t["seed"] for t in trials if t["anomalies"] or t["unsettled"]]
    not_hit = [t["seed"] for t in trials if any(s["verdict"] != "hit" for s in t["shots"])]
    ok, why = passed(res)
    if verdict:
        lines += ["", f"**{'passed' if ok else 'FAILED'}**" + (
            f": {why}" if why else f": no anomaly, nothing unsettled, at least {HIT_RATE:.0%} hit")]
    for title, seeds in (("failing seeds", failing), ("seeds with a fault that did not hit", not_hit)):
        if seeds:
            lines += ["", f"{title}:", "", *[f"    {replay.format(seed=seed, executor=res['executor'])}" for seed in seeds]]
    return "\n".join(lines)


def misses(res: dict[str, Any]) -> str:
    """Every fault that did not hit, with what was seen instead (the report's appendix)."""
    lines = []
    for t in res["trials"]:
        for s in t["shots"]:
            if s["verdict"] != "hit":
                lines.append(f"- seed {t['seed']}: {s['kind']}@{s['moment']}>{s['k']} {s['verdict']}: {s['why']}"
                             + (f" (did: {s['note']})" if s["note"] else ""))
    return "\n".join(lines)


def write(res: dict[str, Any], folder: Path) -> tuple[Path, Path]:
    """The results (``<executor>.json``) and the report (``<executor>.md``) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    data, page = folder / f"{res['executor']}.json", folder / f"{res['executor']}.md"
    data.write_text(json.dumps(res, indent=1, default=str) + "\n")
    page.write_text(markdown(res) + ("\n\nFaults that did not hit:\n\n" + misses(res) if misses(res) else "") + "\n")
    return data, page
