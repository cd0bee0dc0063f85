"""Reading a DAG run's XComs from Airflow's metadata database, as the tests check them."""

from __future__ import annotations

from typing import Any


def xcom(run: Any, task_id: str, key: str = "return_value", map_index: int = -1, *, required: bool = False) -> Any:
    """The deserialized XCom of ``task_id`` in ``run``; None when there is none (or, with
    ``required``, fail saying which is missing)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = (
            session.query(XComModel)
            .filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id=task_id, key=key, map_index=map_index)
            .one_or_none()
        )
        assert row is not None or not required, f"no XCom {key!r} for {task_id}[{map_index}] in {run.run_id}"
        return None if row is None else XComModel.deserialize_value(row)
