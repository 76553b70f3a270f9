"""Pictures of TableTune's documents (profiles, goodput, tables): what ``tabletune tune`` and
``plot`` write, ``tabletune evaluate`` draws and a pipeline run logs to MLflow. Above the core,
beside the tuner; matplotlib is imported only when a plot is drawn."""
