"""What a fault proved: confirmed afterwards from the slot's history, never from the fault's own log.

Each fault fired on a :class:`~.moments.Victim` (an attempt, named by its lease token). Once the
trial's runs finished, its verdict is one of:

- **hit**: the history shows the fault's effect on that attempt (:data:`EFFECTS`);
- **missed**: its condition never came by its deadline (the fault was not injected);
- **unconfirmed**: it fired, but the history does not show its effect (the attempt finished the
  slot itself, say): it proved nothing;
- **failed**: it could not be injected (the trial's log says why).

Only hits count: ``make chaos`` and the trials in ``make test`` fail when fewer than
:data:`HIT_RATE` of a run's faults hit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from support.chaos.moments import Victim

#: The least share of faults that must hit (make chaos, make test).
HIT_RATE = 0.9

#: The effect each kind has on its victim, as the history shows it:
#: ``replaced``: the attempt did not finish the slot and a later attempt took its lease over;
#: ``paused``: it stopped ``paused`` and a later attempt continued; ``cancelled``: it stopped
#: ``cancelled`` with reason ``requested``; ``restarted``: it stopped ``paused`` and a later attempt
#: started the slot over; ``ran_through``: it was running when the fault began (a degraded link is
#: meant to slow an attempt, not to stop it). A fault on a try waiting on a lease (the ``lease_wait``
#: moment) has the effect ``waiter_replaced`` whatever its kind: that process never took the lease
#: (no attempt record names its pid), a later attempt did.
EFFECTS = {
    "kill_worker": "replaced",
    "kill_task": "replaced",
    "freeze_task": "replaced",
    "freeze_worker": "replaced",
    "deploy": "replaced",
    "deploy_paused": "paused",
    "cut_host": "replaced",
    "cut_api": "replaced",
    "cut_db": "replaced",
    "netem": "ran_through",
    "lossy": "ran_through",
    "pg_restart": "replaced",
    "pause": "paused",
    "cancel": "cancelled",
    "restart": "restarted",
}
#: Every fault kind, in the order the reports list them.
KINDS = tuple(EFFECTS)
REQUEST_OUTCOMES = {"pause_requested", "resume_requested", "cancel_requested", "restart_requested", "lease_released",
                    "retry_skipped_requested", "rerun_requested"}


@dataclass
class Shot:
    """One fault of a trial: what it fired on and, after the trial, its verdict."""

    fault: Any  # support.chaos.faults.Fault
    victim: Victim | None = None
    #: what the injection did (the fault's log line), or why it did not fire
    note: str = ""
    verdict: str = ""  # hit, missed, unconfirmed, failed
    why: str = ""  # the history's evidence, or what was seen instead

    def __str__(self) -> str:
        on = f" on {self.victim}" if self.victim else ""
        return f"{self.fault}{on}: {self.verdict or 'pending'}" + (f" ({self.why})" if self.why else "")


def history(cur: Any, job: str, slot: str) -> list[dict[str, Any]]:
    """The slot's attempt records (control requests left out), oldest first."""
    cur.execute("SELECT lease_token, attempt, pid, outcome, stop_reason, started_at, ended_at, position_start, "
                "processed_start, processed_end FROM resumable_attempts WHERE job = %s AND slot = %s ORDER BY id",
                (job, slot))
    names = [d[0] for d in cur.description]
    return [r for r in (dict(zip(names, found, strict=True)) for found in cur.fetchall())
            if r["outcome"] not in REQUEST_OUTCOMES]


def confirm(cur: Any, kind: str, victim: Victim, moment: str = "chunk") -> tuple[bool, str]:
    """Whether the history shows ``kind``'s effect (:data:`EFFECTS`) on ``victim``, and the evidence."""
    records = history(cur, victim.job, victim.slot)
    if moment == "lease_wait":
        own = [r for r in records if r["pid"] == victim.pid]
        took = [r for r in records if r["lease_token"] > victim.token]
        return not own and bool(took), (
            f"try {victim.attempt} (pid {victim.pid}) waited on token {victim.token}: " + (
                f"it took the lease later (token {own[0]['lease_token']})" if own else "it never took the lease")
            + (f"; try {took[0]['attempt']} (token {took[0]['lease_token']}) {took[0]['outcome']} from "
               f"{took[0]['processed_start']}" if took else "; no later try"))
    mine = [r for r in records if r["lease_token"] == victim.token]
    if not mine:
        return False, f"no attempt record holds token {victim.token}"
    me = mine[-1]
    later = [r for r in records if r["lease_token"] > victim.token]
    if me["ended_at"] is None:
        ended = f"try {me['attempt']} (token {victim.token}) never ended (its process died or was cut off)"
    else:
        ended = f"try {me['attempt']} (token {victim.token}) ended {me['outcome']}" + (
            f" ({me['stop_reason']})" if me["stop_reason"] else "") + f" at {me['processed_end']}"
    after = (f"try {later[0]['attempt']} (token {later[0]['lease_token']}) {later[0]['outcome']} from "
             f"{later[0]['processed_start']}") if later else "no later attempt"
    effect = EFFECTS[kind]
    if effect == "ran_through":
        running = me["started_at"] <= victim.at and (me["ended_at"] is None or me["ended_at"] > victim.at)
        return running, f"try {me['attempt']} ran from {me['started_at']:%H:%M:%S.%f} to " + (
            f"{me['ended_at']:%H:%M:%S.%f}" if me["ended_at"] else "?") + f", the fault began {victim.at:%H:%M:%S.%f}"
    if effect == "replaced":
        return me["outcome"] not in ("done", "already_done") and bool(later), f"{ended}; {after}"
    if effect == "paused":
        return me["outcome"] == "paused" and bool(later), f"{ended}; {after}"
    if effect == "cancelled":
        return (me["outcome"], me["stop_reason"]) == ("cancelled", "requested"), ended
    if effect == "restarted":
        over = [r for r in later if r["position_start"] is None and r["processed_start"] == 0]
        return me["outcome"] == "paused" and bool(over), f"{ended}; " + (
            f"try {over[0]['attempt']} (token {over[0]['lease_token']}) started over" if over else after)
    raise ValueError(f"unknown effect {effect!r} of {kind!r}")


def judge(conn: Any, shots: list[Shot]) -> None:
    """Give every fired shot of a finished trial its verdict from the history."""
    with conn.cursor() as cur:
        for shot in shots:
            if shot.verdict:  # missed or failed: decided when it did not fire
                continue
            if shot.victim is None:
                shot.verdict, shot.why = "failed", shot.note or "no victim"
                continue
            hit, shot.why = confirm(cur, shot.fault.kind, shot.victim, shot.fault.moment)
            shot.verdict = "hit" if hit else "unconfirmed"
