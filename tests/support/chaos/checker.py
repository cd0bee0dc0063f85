"""A Jepsen-style checker: it reads only what was committed (the checkpoint rows, the history,
the sinks' logs, the dead letters, the DAG runs' states) and proves, per slot of a trial:

- **end state**: the slot is ``done`` with every item, unless a cancel was taken (then ``done`` or
  ``cancelled`` with reason ``requested``, the checkpoint where the items stop);
- **exactly once** (``ctx.transaction()`` sinks): in the slot's current run each item is committed
  once, skipped items never, and each skipped item is in the dead-letter table once;
- **at most one chunk per interruption** (plain sink): the writes beyond one per item are at most
  ``chunk x interruptions`` (twice that with pipelined checkpoints), and every item is in the upsert;
- **fencing**: every write carries a token the slot's history knows for that attempt; no write of
  the transactional sink committed after a later attempt took the lease (commit timestamps:
  ``track_commit_timestamp``, against the later attempt's ``started_at``, written in the transaction
  that took the lease; ``FENCE_SLACK`` covers a takeover that waited for the row lock the older
  attempt's last commit held); in the plain sink a stale attempt writes at most its unfinished chunk;
- **history agrees with the row**: an attempt record holds the row's lease token; the last record
  ended with the row's status is the row's attempt, with its processed count; tokens never go down;
- **quiet**: once every DAG run finished, no slot is ``running`` (the anomaly names the holder, its
  lease and whether its process lives);
- **liveness**: a DAG run not finished by the trial's deadline (nothing moved for
  :data:`~support.chaos.trials.STALL` seconds) is *unsettled*, not an anomaly by itself: the trial
  says what still runs. Its slots are held to the safety checks above (nothing twice, fencing,
  history) but not to the end state; a slot of it ``running`` with its lease expired and its
  holder's process gone is an anomaly (nothing will finish it).

Each violation is an :class:`Anomaly` naming the slot and what was seen.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from support.chaos.workloads import CHUNK, Run

FENCE_SLACK = timedelta(seconds=0.5)
#: The commit time of a sink row (``track_commit_timestamp``, on in the suite's cluster), else None.
COMMITTED_AT = ("CASE WHEN current_setting('track_commit_timestamp') = 'on' THEN pg_xact_commit_timestamp(xmin) "
                "END")
REQUEST_OUTCOMES = {"pause_requested", "resume_requested", "cancel_requested", "restart_requested", "lease_released"}


@dataclass(frozen=True)
class Anomaly:
    check: str
    job: str
    slot: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.job} / {self.slot}: {self.detail}"


def _rows(cur: Any, sql: str, *params: Any) -> list[dict[str, Any]]:
    cur.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _no_pid(owner: str | None) -> bool | None:
    return None


def check_run(conn: Any, run: Run, dag_state: str, *, holder_alive: Callable[[str | None], bool | None] = _no_pid,
              ) -> tuple[list[Anomaly], dict[str, int]]:
    """The anomalies of one DAG run's slots, and counts (items committed, repeats, interruptions).

    :param dag_state: the DAG run's state; one not ``success``/``failed`` is unsettled (see above).
    :param holder_alive: whether a lease owner's process lives (None: cannot tell)."""
    anomalies: list[Anomaly] = []
    settled = dag_state in ("success", "failed")
    counts = Counter[str]()
    cur = conn.cursor()
    w = run.workload
    for job in w.jobs():
        slot = run.run_id

        def bad(check: str, detail: str, job: str = job, slot: str = slot) -> None:
            anomalies.append(Anomaly(check, job, slot, detail))

        rows = _rows(cur, "SELECT *, lease_expires_at < now() AS lease_expired FROM resumable_checkpoints "
                          "WHERE job = %s AND slot = %s", job, slot)
        if not rows:
            if settled:
                bad("end state", f"no checkpoint row (DAG run {dag_state})")
            continue
        row = rows[0]
        history = _rows(cur, "SELECT * FROM resumable_attempts WHERE job = %s AND slot = %s ORDER BY id", job, slot)
        attempts = [h for h in history if h["outcome"] not in REQUEST_OUTCOMES]
        table = "chaos_tx_log" if w.sink == "tx" else "chaos_plain_log"
        writes = _rows(cur, f"SELECT *, {COMMITTED_AT} AS committed_at FROM {table} "
                            "WHERE job = %s AND slot = %s ORDER BY written_at", job, slot)
        current = [x for x in writes if x["runs"] == row["runs"]]
        requests = run.requests.get(job, [])
        expected_items = w.good_items()
        # The next item: the position itself (a handler's loop), or the one after it (the chunked
        # operator's position is the last item read).
        position = row["position"]
        if position is not None:
            position = int(json.loads(position) if isinstance(position, str) else position) + (1 if w.skips else 0)

        # -- end state ---------------------------------------------------------------------------
        if row["status"] == "running":
            alive = holder_alive(row["lease_owner"])
            holder = (f"holder {row['lease_owner']} ({'alive' if alive else 'gone' if alive is False else '?'}), "
                      f"lease {'expired' if row['lease_expired'] else 'until'} {row['lease_expires_at']}")
            if settled:
                bad("quiet", f"still running with the DAG run {dag_state}; {holder}")
            elif row["lease_expired"] and not alive:
                bad("liveness", f"running with no live holder while its DAG run stalled ({dag_state}); {holder}")
        if not settled:
            pass  # unsettled: the safety checks below only
        elif "cancel" in requests and row["status"] == "cancelled":
            if row["stop_reason"] != "requested":
                bad("end state", f"cancelled with reason {row['stop_reason']!r}, not 'requested'")
            stop = position or 0
            expected_items = {i for i in expected_items if i < stop}
            if dag_state != "failed":
                bad("end state", f"cancelled slot but its DAG run is {dag_state}")
        elif row["status"] != "done" or row["processed"] != w.items:
            bad("end state", f"status {row['status']} processed {row['processed']}/{w.items} "
                             f"(requests {requests or 'none'}, DAG run {dag_state}, last error {row['last_error']!r})")
            continue
        elif dag_state != "success" and not any("cancel" in asked for asked in run.requests.values()):
            # (a mapped run whose other partition was cancelled fails as a whole)
            bad("end state", f"slot done but its DAG run is {dag_state}")

        # -- the sinks ---------------------------------------------------------------------------
        per_item = Counter(x["item"] for x in current)
        counts["items"] += len(set(per_item))
        pids = {(x["attempt"], x["pid"]) for x in current}
        interruptions = max(len(pids) - 1, 0)
        counts["interruptions"] += interruptions
        if w.sink == "tx":
            twice = sorted(i for i, n in per_item.items() if n > 1)
            if twice:
                bad("exactly once", f"items committed more than once: {twice[:10]} (x{max(per_item.values())})")
            if settled and set(per_item) != expected_items:
                missing, extra = sorted(expected_items - set(per_item)), sorted(set(per_item) - expected_items)
                bad("exactly once", f"missing {missing[:10]}, unexpected {extra[:10]}")
            earlier = Counter((x["runs"], x["item"]) for x in writes if x["runs"] != row["runs"])
            if any(n > 1 for n in earlier.values()):
                bad("exactly once", f"an earlier run committed items twice: {[k for k, n in earlier.items() if n > 1][:5]}")
        else:
            extra_writes = sum(per_item.values()) - len(per_item)
            counts["repeated"] += extra_writes
            allowed = w.repeat_chunks * CHUNK * interruptions
            if extra_writes > allowed:
                bad("one chunk", f"{extra_writes} repeated writes over {interruptions} interruptions "
                                 f"(at most {allowed})")
            upserted = {r["item"] for r in _rows(cur, "SELECT item FROM chaos_upsert WHERE job = %s AND slot = %s",
                                                 job, slot)}
            if settled and not expected_items <= upserted:
                bad("one chunk", f"items lost from the upsert sink: {sorted(expected_items - upserted)[:10]}")
        if w.skips:
            dead = Counter(int(d["position"]) for d in _rows(
                cur, "SELECT position FROM resumable_dead_letters WHERE job = %s AND slot = %s", job, slot))
            wanted = {i for i in w.bad_items() if i < (position or 0)}
            if (settled and set(dead) != wanted) or any(n > 1 for n in dead.values()):
                bad("exactly once", f"dead letters {sorted(dead.items())}, expected each of {sorted(wanted)} once")

        # -- fencing -----------------------------------------------------------------------------
        tokens = {(h["lease_token"], h["attempt"]) for h in attempts}
        takeovers = sorted((h["lease_token"], h["started_at"]) for h in attempts)
        stale_plain = Counter[int]()
        for x in writes:
            if (x["token"], x["attempt"]) not in tokens:
                bad("fencing", f"item {x['item']} written by try {x['attempt']} with token {x['token']}, which the "
                               "history does not give that try")
                continue
            later = [at for token, at in takeovers if token > x["token"]]
            if not later:
                continue
            if w.sink == "tx" and (x["committed_at"] or x["written_at"]) > min(later) + FENCE_SLACK:
                bad("fencing", f"item {x['item']} committed at {x['committed_at'] or x['written_at']} by token {x['token']} after "
                               f"token {min(t for t, _ in takeovers if t > x['token'])} took the lease at {min(later)}")
            elif w.sink == "plain" and x["written_at"] > min(later) + FENCE_SLACK:
                stale_plain[x["token"]] += 1
        counts["stale plain writes"] += sum(stale_plain.values())
        for token, n in stale_plain.items():
            if n > w.repeat_chunks * CHUNK:
                bad("fencing", f"token {token} kept writing to the plain sink after losing the lease: {n} writes")

        # -- history -----------------------------------------------------------------------------
        # The row's token is the last one handed out: the attempt that finished the slot, or a later
        # one that found it finished (``already_done`` takes a token too, and leaves the row as it was).
        if not [h for h in attempts if h["lease_token"] == row["lease_token"]]:
            bad("history", f"no attempt record holds the row's token {row['lease_token']}")
        if row["status"] in ("done", "cancelled"):
            ended = [h for h in attempts if h["outcome"] == row["status"]]
            if not ended:
                bad("history", f"no attempt record ended {row['status']}")
            elif (ended[-1]["attempt"], ended[-1]["processed_end"]) != (row["attempt"], row["processed"]):
                bad("history", f"row try {row['attempt']} {row['status']}/{row['processed']}, its record try "
                               f"{ended[-1]['attempt']} {ended[-1]['outcome']}/{ended[-1]['processed_end']}")
        seen = [h["lease_token"] for h in attempts]
        if seen != sorted(seen):
            bad("history", f"lease tokens out of order: {seen}")
    return anomalies, dict(counts)
