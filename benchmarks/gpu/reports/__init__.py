"""The report command's readers (``benchmarks/gpu/report.py``): ``tunes`` for tune folders,
``evaluation`` for an ``evaluate.json`` (an evaluation or a paired referee)."""
