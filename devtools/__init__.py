"""Development tooling shared by the tests, the benchmarks and the make targets (not shipped).

- :mod:`devtools.airflow_env`: the environment of a project-local Airflow (one definition for
  ``make demo``, ``make standalone``, the tests and the benchmarks);
- :mod:`devtools.postgres`: a PostgreSQL server for tests and benchmarks (the machine's, or a
  throwaway cluster);
- :mod:`devtools.dags`: DAG objects by id from a folder, for ``dag.test()``;
- :mod:`devtools.standalone`: ``make standalone`` started and stopped as a whole, and the
  checkpoint store it shares with ``make demo`` and the CLI.
"""
