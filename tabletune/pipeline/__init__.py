"""TableTune's production pipeline: prompt sampling, the validation gate's rules, the promotion
state machine, and the steps the Airflow DAGs call (``flows``).

Pure modules (``sampling``, ``gate``, ``promotion``, ``deployment``, ``rebuild``) import only the
core and the standard library; services are reached through ``tabletune.adapters``.
"""
