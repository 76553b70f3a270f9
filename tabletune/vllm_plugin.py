"""Old entry-point path: the venv installed before tabletune.vllm registers ``tabletune.vllm_plugin:register``.

Remove once the package is re-installed (``pip install -e .`` re-reads pyproject.toml).
"""

from tabletune.vllm.plugin import register  # noqa: F401
