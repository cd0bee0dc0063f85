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


@dataclass(frozen=True)
class Workload:
    dag_id: str
    sink: str  # "tx": ctx.transaction(); "plain": the upsert on its own connection
    #: chunks an interruption may repeat in the plain sink (two with pipelined checkpoints)
    repeat_chunks: int = 1
    partitions: int = 0  # mapped: jobs <dag_id>.work[i]
    items: int = ITEMS
    skips: bool = False

    def jobs(self) -> list[str]:
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
        return {"items": self.workload.items, "chunk": CHUNK, "delay": self.delay}


def zombie_delay(workload: Workload, k: int) -> float:
    """The item wait that leaves ``workload``'s run :data:`ZOMBIE_WORK` seconds of work after its
    ``k``-th checkpoint (at least :data:`ZOMBIE_DELAY`)."""
    return max(ZOMBIE_DELAY, ZOMBIE_WORK / max(1, workload.items - k * CHUNK))
