"""Pictures of TableTune's documents (profiles, goodput, tables): what ``tabletune tune`` and
``plot`` write, ``tabletune evaluate`` draws and a pipeline run logs to MLflow (``plots``); and the
text report of a table document that ``show``, ``build`` and ``tune`` print (``text``). Above the
core, beside the tuner; matplotlib is imported only when a plot is drawn."""
