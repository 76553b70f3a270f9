"""docs/faults.md names a test for each row; each must exist (a renamed test would leave a row
that nothing holds)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_named_in_faults_md_exists():
    text = (ROOT / "docs" / "faults.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", text)
    assert len(named) > 150
    missing = []
    for path, name in named:
        source = ROOT / path
        if not source.is_file() or not re.search(rf"^\s*(async )?def {name}\(",
                                                 source.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert missing == []
