"""The environment of a project-local Airflow, written once.

Airflow reads its configuration when first imported, so whoever uses this sets it before anything
imports Airflow: Python code calls :func:`apply`, shell scripts evaluate the ``export`` lines that
``python -m devtools.airflow_env`` prints.

    eval "$(python -m devtools.airflow_env --home .airflow-home --dags dags --conn sqlite:////abs/ck.db)"
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping
from pathlib import Path


def environment(
    home: str | os.PathLike[str],
    dags: str | os.PathLike[str],
    *,
    conn: str | None = None,
    log_level: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The variables of an Airflow home at ``home`` with the DAGs of ``dags``.

    ``conn`` is the checkpoint store's connection URI (``resumable_default``); None leaves it unset.
    """
    env = {
        "AIRFLOW_HOME": str(Path(home).resolve()),
        "AIRFLOW__CORE__DAGS_FOLDER": str(Path(dags).resolve()),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        # `airflow standalone` starts one worker process per slot: 4 keep it near 1 GB, not 5.
        "AIRFLOW__CORE__PARALLELISM": "4",
    }
    if log_level:
        env["AIRFLOW__LOGGING__LOGGING_LEVEL"] = log_level
    if conn:
        env["AIRFLOW_CONN_RESUMABLE_DEFAULT"] = conn
    env.update(extra or {})
    return env


def apply(env: Mapping[str, str], *, keep_conn: bool = False) -> None:
    """Set ``env`` in this process, first dropping inherited settings that would override it (a
    metadata database, the checkpoint connection) unless ``env`` sets them itself."""
    for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", *(() if keep_conn else ("AIRFLOW_CONN_RESUMABLE_DEFAULT",))):
        if key not in env:
            os.environ.pop(key, None)
    os.environ.update(env)


def main() -> None:
    parser = argparse.ArgumentParser(description="print the export lines of a project-local Airflow")
    parser.add_argument("--home", required=True)
    parser.add_argument("--dags", required=True)
    parser.add_argument("--conn")
    parser.add_argument("--log-level")
    args = parser.parse_args()
    for key, value in environment(args.home, args.dags, conn=args.conn, log_level=args.log_level).items():
        print(f"export {key}={shlex.quote(value)}")


if __name__ == "__main__":
    main()
