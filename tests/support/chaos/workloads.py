"""The workloads of tests/dags/chaos_dags.py as the trials start and the checker reads them."""

from __future__ import annotations

from dataclasses import dataclass, field

ITEMS, CHUNK, DELAY = 32, 4, 0.2  # a run is 6.4 s of work (once its task started): faults find it running
MAPPED_PARTITIONS, MAPPED_ITEMS = 3, 24
#: Seconds of work a run keeps after the checkpoint a zombie-making fault waits for (``cut_api``, and
#: the cause of a ``lease_wait`` fault): longer than Airflow takes to give the cut-off try up and
#: start the next (the heartbeat timeout, the retry delay, a task's start: 14-46 s measured), so the
#: zombie is still working when its newer try comes, instead of finishing first.
ZOMBIE_WORK = 45.0
#: ... and each of its items waits at least this long: a chunk of 10 s or more, the newer try's wait
#: for the zombie's next checkpoint (a ``lease_wait`` fault's moment) long enough to be seen.
ZOMBIE_DELAY = 2.5
BAD_EVERY = 7
#: chaos_rebalance: a table of this many ids (0 ..), split in REBALANCE_PARTITIONS ranges of the same
#: size; the rows of the first range cost SLOW times an item's wait, so the others finish early and
#: take the upper half of what it has left (rebalancing), again while it has more than two chunks left.
REBALANCE_ITEMS, REBALANCE_PARTITIONS, SLOW = 96, 3, 4
SLOW_BELOW = REBALANCE_ITEMS // REBALANCE_PARTITIONS


@dataclass(frozen=True)
class Workload:
    dag_id: str
    sink: str  # "tx": ctx.transaction(); "plain": the upsert on its own connection
    #: chunks an interruption may repeat in the plain sink (two with pipelined checkpoints)
    repeat_chunks: int = 1
    partitions: int = 0  # mapped: jobs <dag_id>.work[i]
    items: int = ITEMS
    skips: bool = False
    #: ``partitioned(..., rebalance=True)`` over ``chaos_source``: its ranges are the plan row's
    #: (``<dag_id>.work[i]`` and the ranges splits took, ``<dag_id>.work[i].n``), known only from it
    rebalance: bool = False

    @property
    def base(self) -> str:
        """The partitioned job's name (its plan row is ``<base>#plan``)."""
        return f"{self.dag_id}.work"

    def jobs(self) -> list[str]:
        """The slots known before the run: a partitioned job's planned partitions (not the ranges
        rebalancing takes from them: :func:`support.chaos.checker.plan_ranges` reads those)."""
        if self.partitions:
            return [f"{self.dag_id}.work[{i}]" for i in range(self.partitions)]
        return [f"{self.dag_id}.work"]

    def good_items(self) -> set[int]:
        return {i for i in range(self.items) if not (self.skips and i % BAD_EVERY == 3)}

    def bad_items(self) -> set[int]:
        return set(range(self.items)) - self.good_items()


WORKLOADS = (
    Workload("chaos_tx", "tx"),
    Workload("chaos_upsert", "plain"),
    Workload("chaos_mapped", "tx", partitions=MAPPED_PARTITIONS, items=MAPPED_ITEMS),
    Workload("chaos_pipelined", "plain", repeat_chunks=2),
    Workload("chaos_skip", "tx", skips=True),
    Workload("chaos_rebalance", "tx", partitions=REBALANCE_PARTITIONS, items=REBALANCE_ITEMS, rebalance=True),
)
DAG_IDS = [w.dag_id for w in WORKLOADS]


@dataclass
class Run:
    """One DAG run of a trial, and the requests made to its slots."""

    workload: Workload
    run_id: str
    #: control requests taken (not refused), by job: ["pause", "resume", "cancel", "restart"]
    requests: dict[str, list[str]] = field(default_factory=dict)

    #: seconds each item waits (:data:`DELAY`, longer for a zombie's run: :func:`zombie_delay`)
    delay: float = DELAY

    @property
    def conf(self) -> dict[str, object]:
        conf: dict[str, object] = {"items": self.workload.items, "chunk": CHUNK, "delay": self.delay}
        if self.workload.rebalance:
            conf.update(slow_below=SLOW_BELOW, slow=SLOW)
        return conf


def zombie_delay(workload: Workload, k: int) -> float:
    """The item wait that leaves ``workload``'s run :data:`ZOMBIE_WORK` seconds of work after its
    ``k``-th checkpoint (at least :data:`ZOMBIE_DELAY`)."""
    return max(ZOMBIE_DELAY, ZOMBIE_WORK / max(1, workload.items - k * CHUNK))
