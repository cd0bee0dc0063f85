"""The loan report of row 2 under :class:`bench.profile.Breakdown` and cProfile: its parts and its
top functions, for when a component needs a closer look (``python -m bench.cprofile_report``)."""

from __future__ import annotations

from airflow_resumable.core.model.identity import Identity
from bench.profile import Breakdown


def main() -> None:  # pragma: no cover - a tool
    import cProfile
    import pstats

    from airflow_resumable.core.attempt.runner import Attempt, Options
    from airflow_resumable.core.stores import PostgresStore
    from bench.common import Database
    from bench.loans import create_loans, report_handler

    db = Database()
    try:
        params = db.schema_params("loans")
        setup = db.connect("loans")
        create_loans(setup, 300_000)
        setup.close()
        store = PostgresStore(**params)
        reader = db.connect("loans", autocommit=True)
        runs = iter(range(10**6))

        def once() -> None:
            Attempt(
                store, Identity(job="profile", slot=f"run-{next(runs)}", attempt=1, owner="bench"),
                options=Options(lease=30),
            ).run(report_handler(reader))

        once()
        breakdown = Breakdown()
        with breakdown.active():
            for _ in range(5):
                with breakdown.run():
                    once()
        print("\n".join(breakdown.lines(items=300_000)))
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(3):
            once()
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    finally:
        db.drop()


if __name__ == "__main__":  # pragma: no cover
    main()
