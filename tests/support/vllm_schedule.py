"""vLLM's own schedule validator, for tests that check our tables against it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


def vllm_schedule_utils():
    """vLLM's own schedule validator (vllm/v1/spec_decode/dynamic/utils.py).

    The module imports nothing, but ``import vllm.v1...`` first runs vllm/__init__ (torch, ~9 s),
    so it is loaded from its file unless something already imported it.
    """
    name = "vllm.v1.spec_decode.dynamic.utils"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed", allow_module_level=True)
    path = Path(spec.origin).parent / "v1" / "spec_decode" / "dynamic" / "utils.py"
    mod_spec = importlib.util.spec_from_file_location("_vllm_dynamic_sd_utils", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module
