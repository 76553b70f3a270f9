"""The tuner's own ``tabletune`` commands, one module a group: ``measure`` (tune, profile,
acceptance: they start an engine), ``tables`` (build, show, plot: documents only), and the checks
both make (``checks``). Each module adds its commands' parsers, as ``evaluate`` and ``doctor``
do; ``tabletune.cli`` lists them in ``COMMANDS`` and never is imported by them."""
