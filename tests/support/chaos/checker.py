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

A partitioned job with rebalancing (``chaos_rebalance``) has slots known only from its plan row
(``<job>#plan``): its partitions' ranges and the ranges splits took from them while they ran
(``<job>[i].n``). :func:`plan_ranges` works them out from the row's boundaries and splits, apart from
the product's own reading of it, and each range is held to the checks above over the source's keys
it holds; and across the ranges:

- **tiling**: the plan's ranges hold every key of the source once (no split overlaps another range
  or leaves a gap), each split cuts inside the range it splits, each range's row reads the range
  the plan gives it (a victim that kept more, or less, than the plan says would read keys twice, or
  leave some to nobody), no row runs a range the plan does not hold, and every key was written by
  the range that holds it;
- **exactly once across ranges**: no key committed by two ranges (a duplicate across a split);
- **summary**: the summary task's figures (the REST API's, when the trial read them) agree with
  the rows: ``planned = processed + skipped``, the source's rows planned, the ranges' processed
  added up, every key written counted once; every partition done when the run succeeded.

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


def _holds(rng: tuple[Any, Any], key: int) -> bool:
    """Whether the range ``(after, until]`` (None: open at that end) holds ``key``."""
    after, until = rng
    return (after is None or key > after) and (until is None or key <= until)


def _shown(rng: tuple[Any, Any]) -> str:
    after, until = rng
    return f"({'start' if after is None else after}, {'end' if until is None else until}]"


def plan_ranges(state: dict[str, Any], base: str) -> tuple[dict[str, tuple[Any, Any]], list[str]]:
    """The ranges a plan row's ``state`` gives, by job (``<base>[i]``, ``<base>[i].n``), as
    ``(after, until]`` keys (None: open at that end), and what is wrong with its splits (a cut that
    does not lie inside the range it splits). Read from the row's JSON as stored: planned ranges cut
    at ``boundaries``, then each split in order cuts range ``of`` after key ``at``, the keys after it
    up to where ``of`` ended becoming range ``<i>.<number>``."""
    boundaries = list(state.get("boundaries") or [])
    count = int(state["partitions"])
    ranges: dict[str, tuple[Any, Any]] = {}
    for i in range(count):
        ranges[str(i)] = (boundaries[i - 1] if i > 0 else None, boundaries[i] if i < count - 1 else None)
    problems = []
    for cut in state.get("splits") or []:
        of, at, number = str(cut["of"]), cut["at"], cut["number"]
        if of not in ranges:
            problems.append(f"split {number} cuts range {of!r}, which the plan does not hold")
            continue
        after, until = ranges[of]
        if at is None or (after is not None and at <= after) or (until is not None and at >= until):
            problems.append(f"split {number} cuts range {of} {_shown((after, until))} after key {at}, not inside it")
        ranges[of] = (after, at)
        ranges[f"{of.split('.')[0]}.{number}"] = (at, until)
    return {f"{base}[{name.split('.')[0]}]" + (f".{name.split('.')[1]}" if "." in name else ""): rng
            for name, rng in ranges.items()}, problems


def check_plan(cur: Any, run: Run, dag_state: str, summary: dict[str, Any] | None,
               bad: Callable[..., None]) -> dict[str, set[int]] | None:
    """The cross-range checks of a rebalanced job's run (see the module's docstring); returns each
    range's keys by job (None: no plan row)."""
    w, slot = run.workload, run.run_id
    plan_job = f"{w.base}#plan"
    found = _rows(cur, "SELECT state FROM resumable_checkpoints WHERE job = %s AND slot = %s", plan_job, slot)
    if not found:
        if dag_state in ("success", "failed"):
            bad("end state", f"no plan row (DAG run {dag_state})", job=plan_job)
        return None
    state = found[0]["state"]
    state = json.loads(state) if isinstance(state, str) else state
    try:
        ranges, problems = plan_ranges(state, w.base)
    except (KeyError, TypeError, ValueError) as exc:
        bad("tiling", f"the plan row's state is not a plan ({exc!r}): {str(state)[:200]}", job=plan_job)
        return None
    for problem in problems:
        bad("tiling", problem, job=plan_job)
    keys = set(range(w.items))
    holders = {key: [job for job, rng in ranges.items() if _holds(rng, key)] for key in keys}
    gap = sorted(k for k, jobs in holders.items() if not jobs)
    twice = {k: jobs for k, jobs in holders.items() if len(jobs) > 1}
    if gap:
        bad("tiling", f"the plan's ranges leave keys {gap[:10]} to no range", job=plan_job)
    if twice:
        bad("tiling", f"the plan's ranges overlap: {sorted(twice.items())[:5]}", job=plan_job)

    rows = {r["job"]: r for r in _rows(cur, "SELECT job, status, processed, runs, reader FROM resumable_checkpoints "
                                            "WHERE job LIKE %s AND slot = %s AND job <> %s", f"{w.base}[%", slot,
                                       plan_job)}
    for job, r in rows.items():
        if job not in ranges:
            bad("tiling", f"a row ran a range the plan does not hold ({r['status']}, {r['processed']} processed)",
                job=job)
            continue
        reader = r["reader"]
        reader = json.loads(reader) if isinstance(reader, str) else reader
        reads = (reader or {}).get("range")
        if reads is not None and (reads.get("after"), reads.get("until")) != ranges[job]:
            left = sorted(k for k in keys if _holds(ranges[job], k) and not _holds((reads.get("after"),
                                                                                      reads.get("until")), k))
            more = sorted(k for k in keys if _holds((reads.get("after"), reads.get("until")), k)
                          and not _holds(ranges[job], k))
            bad("tiling", f"its row reads {_shown((reads.get('after'), reads.get('until')))}, the plan gives it "
                          f"{_shown(ranges[job])}: keys {left[:10]} left to no range, {more[:10]} read by two",
                job=job)

    writes = _rows(cur, "SELECT job, item, runs FROM chaos_tx_log WHERE job LIKE %s AND slot = %s", f"{w.base}[%",
                   slot)
    current = [x for x in writes if x["job"] in rows and x["runs"] == rows[x["job"]]["runs"]]
    by_item: dict[int, list[str]] = {}
    for x in current:
        by_item.setdefault(x["item"], []).append(x["job"])
        if x["job"] in ranges and not _holds(ranges[x["job"]], x["item"]):
            bad("tiling", f"key {x['item']} written by a range that does not hold it {_shown(ranges[x['job']])}",
                job=x["job"])
    across = {k: sorted(jobs) for k, jobs in by_item.items() if len(set(jobs)) > 1}
    if across:
        bad("exactly once", f"keys committed by more than one range: {sorted(across.items())[:5]}", job=w.base)

    if summary is not None:
        planned, processed, skipped = (summary.get(k) for k in ("planned", "processed", "skipped"))
        counted = sum(int(rows[job]["processed"]) for job in ranges if job in rows)
        if None in (planned, processed, skipped) or planned != processed + skipped:
            bad("summary", f"planned {planned} != processed {processed} + skipped {skipped}", job=w.base)
        if planned != w.items:
            bad("summary", f"planned {planned}, the source holds {w.items} rows", job=w.base)
        if processed != counted:
            bad("summary", f"processed {processed}, the ranges' rows add up to {counted}", job=w.base)
        if dag_state == "success" and processed != len(by_item):
            bad("summary", f"processed {processed}, {len(by_item)} keys were written", job=w.base)
        if dag_state == "success" and (summary.get("done"), summary.get("unfinished")) != (w.partitions, 0):
            bad("summary", f"done {summary.get('done')} of {w.partitions}, unfinished {summary.get('unfinished')} "
                           "in a run that succeeded", job=w.base)
    return {job: {k for k in keys if _holds(rng, k)} for job, rng in ranges.items()}


def check_run(conn: Any, run: Run, dag_state: str, *, holder_alive: Callable[[str | None], bool | None] = _no_pid,
              summary: dict[str, Any] | None = None) -> tuple[list[Anomaly], dict[str, int]]:
    """The anomalies of one DAG run's slots, and counts (items committed, repeats, interruptions).

    :param dag_state: the DAG run's state; one not ``success``/``failed`` is unsettled (see above).
    :param holder_alive: whether a lease owner's process lives (None: cannot tell).
    :param summary: a partitioned job's summary task's return value (None: not read)."""
    anomalies: list[Anomaly] = []
    settled = dag_state in ("success", "failed")
    counts = Counter[str]()
    cur = conn.cursor()
    w = run.workload
    expected_of: dict[str, set[int]] = {job: w.good_items() for job in w.jobs()}
    if w.rebalance:
        def plan_bad(check: str, detail: str, job: str) -> None:
            anomalies.append(Anomaly(check, job, run.run_id, detail))

        ranges = check_plan(cur, run, dag_state, summary, plan_bad)
        if ranges is not None:
            expected_of = ranges
            counts["splits"] += sum("]." in job for job in ranges)
    for job, expected_range in expected_of.items():
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
        expected_items = set(expected_range)
        expected_count = len(expected_items) if w.rebalance else w.items
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
        elif row["status"] != "done" or row["processed"] != expected_count:
            bad("end state", f"status {row['status']} processed {row['processed']}/{expected_count} "
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
