"""TableTune's production pipeline: the validation gate's rules, the deployment key, the
controller-evidence rebuild, and the steps the Airflow DAGs call (``flows``).

Services are reached through ``tabletune.adapters``. The pure rules the adapters also run live in
the core (``tabletune.core.sampling``, ``tabletune.core.promotion``, ``tabletune.core.redaction``,
``tabletune.core.pipeline_errors``), so no adapter imports this package.
"""
