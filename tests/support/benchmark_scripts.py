"""Load a script of benchmarks/gpu/ (or benchmarks/staging/: STAGING) as a module for its tests, the way it runs: from its folder
(a script imports its neighbours by name) and registered under its name (dataclasses look their
module up in sys.modules)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
STAGING = Path(__file__).resolve().parents[2] / "benchmarks" / "staging"


def script_path(file_name: str) -> Path:
    return SCRIPTS / file_name


def load_report(name: str) -> ModuleType:
    """A module of benchmarks/gpu/reports/ (the report command's readers), imported as
    report.py imports it."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    return importlib.import_module(f"reports.{name}")


def load_script(file_name: str, folder: Path = SCRIPTS) -> ModuleType:
    name = Path(file_name).stem
    if name in sys.modules:
        return sys.modules[name]
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(name, folder / file_name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
