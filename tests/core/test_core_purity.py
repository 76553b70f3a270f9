"""tabletune.core must stay importable without vLLM, torch or the pipeline stack."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import tabletune.core

FORBIDDEN = ("vllm", "torch", "airflow", "mlflow", "boto3", "great_expectations")
CORE_DIR = Path(tabletune.core.__file__).parent


def test_importing_core_loads_no_heavy_dependency():
    code = (
        "import json, sys\n"
        "import tabletune.core\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(json.dumps(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_core_modules_import_only_numpy_and_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"numpy", "tabletune", "__future__"}
    for path in sorted(CORE_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"
                if name.startswith("tabletune"):
                    assert name.startswith("tabletune.core"), f"{path.name} imports {name}"
