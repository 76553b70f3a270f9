"""TableTune's production pipeline: the validation gate's rules, the deployment key, the
controller-evidence rebuild, the steps the Airflow DAGs call (``run_lifecycle``: a run's start and
end; ``weekly_flow``, ``reprofile_flow``: each DAG's own steps; ``candidate_flow``: rebuild to
promotion, shared by both) and registry administration (``registry_admin``).

Services are reached through ``tabletune.adapters``. The pure rules the adapters also run live in
the core (``tabletune.core.sampling``, ``tabletune.core.promotion``, ``tabletune.core.redaction``,
``tabletune.core.pipeline_errors``), so no adapter imports this package.
"""
