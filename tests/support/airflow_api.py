"""Airflow helpers for the DAG tests that run in-process (``dag.test()``); the REST client of
the local stack is ``infra/local/local_airflow.py`` (``AirflowApi``)."""

from __future__ import annotations


def pause_in_scheduler(*dag_ids: str) -> None:
    """Pause DAGs in the metadata DB so the running scheduler leaves dag.test() runs alone.

    An unpaused DAG's manual runs are picked up by the local stack's scheduler too, and two
    runners of one task instance conflict ("TI was not in a state where it could be marked as
    running").
    """
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        for dag_id in dag_ids:
            session.query(DagModel).filter(DagModel.dag_id == dag_id).update(
                {DagModel.is_paused: True})
