"""Arrows point one way: every import in tabletune/, dags/ and plugins/ (module level and inside
functions) goes to the importer's own layer or a lower one, and no two packages import each
other, directly or round a loop.

Layers, lowest first (docs/architecture.md, "Layers"):

    core  <-  engine, tuner, controller, simulator, report  <-  adapters  <-  pipeline
          <-  cli (top-level tabletune/*.py), tabletune/vllm, dags/, plugins/
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS = {
    "core": 0,
    "engine": 1, "tuner": 1, "controller": 1, "simulator": 1, "report": 1,
    "adapters": 2,
    "pipeline": 3,
    "cli": 4, "vllm": 4, "dags": 4, "plugins": 4,
}
# The top-level modules (cli.py, evaluate.py, doctor.py, engine_args.py, prompt_args.py) are one
# unit here; that evaluate and doctor never import cli is checked in tests/cli/test_command_modules.py.


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str | None:
    """The package a module counts under: tabletune.<pkg>.* -> pkg, other tabletune.* -> cli,
    dags.* -> dags, plugins.* / tabletune_airflow -> plugins; None: not ours."""
    parts = module.split(".")
    if parts[0] == "tabletune":
        if len(parts) == 1:
            return "cli"
        return parts[1] if parts[1] in LAYERS and parts[1] != "cli" else "cli"
    if parts[0] == "dags":
        return "dags"
    if parts[0] in ("plugins", "tabletune_airflow"):
        return "plugins"
    return None


def _imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, imported module) for every import of our code in ``path``, however deep."""
    module = _module_name(path, root)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                names = [".".join(base + ([node.module] if node.module else []))]
            else:
                names = [node.module or ""]
            # ``from tabletune import vllm`` imports the subpackage, not just the package.
            names += [f"{names[0]}.{alias.name}" for alias in node.names
                      if names[0] == "tabletune"]
        else:
            continue
        found += [(node.lineno, name) for name in names if _unit(name) is not None]
    return sorted(found)


def _sources() -> list[Path]:
    return sorted([*ROOT.glob("tabletune/**/*.py"), *ROOT.glob("dags/*.py"),
                   *ROOT.glob("plugins/*.py")])


def _edges() -> list[tuple[str, int, str, str, str]]:
    """(file, line, importer unit, imported unit, imported module)."""
    out = []
    for path in _sources():
        here = _unit(_module_name(path))
        for line, name in _imports(path):
            there = _unit(name)
            if name == "tabletune":
                continue  # the bare namespace package holds nothing
            out.append((str(path.relative_to(ROOT)), line, here, there, name))
    return out


def test_every_source_file_is_in_a_layer():
    units = {_unit(_module_name(p)) for p in _sources()}
    assert units <= set(LAYERS), units - set(LAYERS)


def test_no_import_points_up_a_layer():
    wrong = [f"{file}:{line}: {here} (layer {LAYERS[here]}) imports {name} "
             f"({there}, layer {LAYERS[there]})"
             for file, line, here, there, name in _edges() if LAYERS[there] > LAYERS[here]]
    assert not wrong, "imports pointing up a layer:\n" + "\n".join(wrong)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for _, _, here, there, _ in _edges():
        if here != there:
            graph.setdefault(here, set()).add(there)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_vllm_process_loads_no_pipeline_and_no_mlflow():
    """What the engine process imports for the controller, the scheduler aside (it needs vLLM):
    the controller's wiring pulls in the prior loader and the runtime, never the pipeline, the
    MLflow client or the DAG stack."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "import tabletune.vllm.controller_setup, tabletune.vllm.lookup, tabletune.vllm.plugin\n"
        "import tabletune.adapters.mlflow_prior\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('tabletune.pipeline', 'mlflow', "
        "'airflow', 'great_expectations', 'boto3', 'tabletune.adapters.mlflow_registry')))\n"
        "print(json.dumps(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, cwd=ROOT)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


# The estimator and its parts are pure: the core and each other only (the runtime, which checks
# the prior against the engine's fingerprint, may import the engine).
PURE_CONTROLLER = ("estimator", "settings", "acceptance_blend", "live_steps", "step_model",
                   "drift", "hold", "records", "rebuild", "state", "stale", "step_clock")


def test_the_estimator_and_its_parts_import_only_the_core_and_each_other():
    wrong = [f"{path.name}:{line}: {name}"
             for module in PURE_CONTROLLER
             for path in [ROOT / "tabletune" / "controller" / f"{module}.py"]
             for line, name in _imports(path)
             if _unit(name) not in ("core", "controller")]
    assert wrong == []


def test_the_lock_uses_the_registry_only_through_what_the_registry_passes_it():
    """No circle inside the adapters: the registry imports the lock, never the other way."""
    lock = ROOT / "tabletune" / "adapters" / "mlflow_lock.py"
    assert [name for _, name in _imports(lock) if "mlflow_registry" in name] == []
    assert "._call(" not in lock.read_text() and "._client" not in lock.read_text()


def test_what_the_dag_files_import_at_parse_time_loads_no_numpy_aiohttp_or_tuner():
    """The DAG files import these modules at parse time (params' defaults, env variables)."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "import tabletune.core.defaults, tabletune.core.envs\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', "
        "'aiohttp') or m.startswith('tabletune.tuner'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, cwd=ROOT)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    at_parse = {node.module for path in ROOT.glob("dags/*.py")
                for node in ast.parse(path.read_text()).body  # module level: run at parse time
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tabletune.")}
    # ``from tabletune.core import envs`` names the package (it loads its own names lazily).
    assert at_parse <= {"tabletune.core", "tabletune.core.defaults", "tabletune.core.envs"}, at_parse


@pytest.mark.parametrize("graph, cycle", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b"}, "b": {"c"}}, None),
])
def test_the_cycle_finder_finds_a_loop_and_only_a_loop(graph, cycle):
    assert _cycle(graph) == cycle


def test_the_walker_sees_imports_inside_functions_and_relative_ones(tmp_path):
    source = tmp_path / "tabletune" / "adapters" / "x.py"
    source.parent.mkdir(parents=True)
    source.write_text("def f():\n    from tabletune.pipeline import flows\n"
                      "from ..pipeline.gate import run_gate\n")
    assert _imports(source, tmp_path) == [(2, "tabletune.pipeline"),
                                          (3, "tabletune.pipeline.gate")]


def test_every_module_of_ours_that_is_imported_exists():
    """A module moved without its importers (an import inside a function fails only when it
    runs) shows here."""
    def exists(name: str) -> bool:
        path = ROOT.joinpath(*name.split("."))
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

    missing = [f"{file}:{line}: {name}" for file, line, _, _, name in _edges()
               if name.startswith("tabletune.") and not exists(name)]
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)
