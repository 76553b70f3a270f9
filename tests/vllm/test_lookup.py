"""What the scheduler puts in place of vLLM's ``dynamic_sd_lookup`` (``tabletune.vllm.lookup``):
the control file first, then the controller, falling back to the last good table."""

from __future__ import annotations

import json
import logging

from tabletune.vllm.lookup import ControlFile, StepLookup


class _Exploding:
    def __init__(self, table):
        self.calls = 0
        self.estimator = type("E", (), {"table": table})()

    def k_for_step(self, batch_size):
        self.calls += 1
        raise RuntimeError("boom")


def test_lookup_falls_back_to_the_controllers_last_table_and_logs_once(caplog):
    from tabletune.core.tables import DraftTable

    learned = DraftTable.from_ranges([[1, 4, 3], [5, 8, 1]])
    controller = _Exploding(learned)
    lookup = StepLookup([0] + [0] * 8, 3, ControlFile(None), controller)
    with caplog.at_level(logging.ERROR, logger="vllm.tabletune.scheduler"):
        ks = [lookup[b] for b in (1, 4, 6, 8, 2)]
    assert ks == [3, 3, 1, 1, 3]
    assert controller.calls == 1  # dropped after the first failure
    assert sum("running on the last good table" in r.message for r in caplog.records) == 1


def test_control_file_pins_k_and_clamps_to_max(tmp_path):
    path = tmp_path / "control.json"
    lookup = StepLookup([0] + [2] * 8, 3, ControlFile(str(path)))
    assert lookup[5] == 2  # no file: the static table
    path.write_text(json.dumps({"force_k": 1}))
    assert lookup[5] == 1 and lookup[1] == 1
    path.write_text(json.dumps({"force_k": 9, "pad": "x"}))  # size change → re-read
    assert lookup[3] == 3


def test_a_control_file_that_is_a_fifo_never_stalls_a_step(tmp_path):
    import os
    import threading

    fifo = tmp_path / "control.json"
    os.mkfifo(fifo)
    lookup = StepLookup([0] + [2] * 8, 3, ControlFile(str(fifo)))
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("k", lookup[4]), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "the step blocked opening the FIFO"
    assert box["k"] == 2  # the static table is served


def test_a_control_file_with_duplicate_keys_is_not_half_applied(tmp_path):
    path = tmp_path / "control.json"
    path.write_text('{"force_k": 1, "force_k": 3}')
    lookup = StepLookup([0] + [2] * 8, 3, ControlFile(str(path)))
    assert lookup[4] == 2
