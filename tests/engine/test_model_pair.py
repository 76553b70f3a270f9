"""Building the embedded model pair writes no "Writing model shards" progress bars into a tune
log; transformers' own bar switch is left as it was found."""

from __future__ import annotations

import io

from transformers.utils import logging as hf_logging

from tabletune.engine.model_pair import _quiet_transformers_progress


def _bar_output() -> str:
    """What transformers' tqdm (the one save_pretrained uses) draws for a two-item loop."""
    stream = io.StringIO()
    for _ in hf_logging.tqdm(range(2), desc="Writing model shards", file=stream):
        pass
    return stream.getvalue()


def test_save_bars_are_silent_inside_and_restored_after():
    found_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    try:
        assert "Writing model shards" in _bar_output()
        with _quiet_transformers_progress():
            assert _bar_output() == ""
        assert hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        with _quiet_transformers_progress():
            pass
        assert not hf_logging.is_progress_bar_enabled()  # a user's "off" stays off
    finally:
        (hf_logging.enable_progress_bar if found_enabled else hf_logging.disable_progress_bar)()
