"""infra/docker/gpu-worker.Dockerfile: one vLLM image everywhere it is named (vLLM 0.34.0), and
its orchestration install keeps the image's vLLM stack: lock pins for packages the image has are
dropped, the rest installs under vLLM's declared requirements as constraints."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
IMAGE = "vllm/vllm-openai:v0.34.0"


def test_every_default_names_the_same_vllm_image():
    dockerfile = (REPO / "infra/docker/gpu-worker.Dockerfile").read_text()
    assert re.search(r"^ARG VLLM_IMAGE=(\S+)$", dockerfile, re.M).group(1) == IMAGE
    compose = (REPO / "docker-compose.yaml").read_text()
    assert re.search(r"VLLM_IMAGE: \$\{VLLM_IMAGE:-(\S+)\}", compose).group(1) == IMAGE
    example = (REPO / "infra/compose.env.example").read_text()
    assert re.search(r"^VLLM_IMAGE=(\S+)$", example, re.M).group(1) == IMAGE


def test_the_helper_the_dockerfile_copies_is_in_the_build_context():
    dockerfile = (REPO / "infra/docker/gpu-worker.Dockerfile").read_text()
    assert "COPY infra/docker/orchestration_pins.py" in dockerfile
    assert "-c /tmp/vllm-constraints.txt" in dockerfile
    assert "!infra/docker/" in (REPO / ".dockerignore").read_text()


def _helper():
    spec = importlib.util.spec_from_file_location(
        "orchestration_pins", REPO / "infra/docker/orchestration_pins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lock_pins_the_image_has_are_dropped_and_vllm_requirements_constrain(tmp_path,
                                                                               monkeypatch):
    helper = _helper()
    installed = {"vllm": "0.34.0", "torch": "2.14.0", "cachetools": "8.0.3", "Packaging": "26.4"}
    monkeypatch.setattr(helper.md, "distributions", lambda: [
        SimpleNamespace(metadata={"Name": n}) for n in installed])
    monkeypatch.setattr(helper.md, "version", lambda name: installed[name])
    monkeypatch.setattr(helper.md, "requires", lambda name: [
        "torch==2.14.0", "cachetools", "fastapi[standard]<0.137.0,>=0.133.0",
        'six>=1.16.0; python_version > "3.11"', 'zentorch==2.14.0.2; extra == "zen"'])
    lock = tmp_path / "lock.txt"
    lock.write_text("# exported\napache-airflow==3.3.2\ncachetools==7.3.3\npackaging==26.3\n"
                    "fastapi==0.136.3\nnumpy==2.3.5 ; python_full_version < '3.13'\n")
    orchestration, constraints = tmp_path / "o.txt", tmp_path / "c.txt"
    assert helper.main(str(lock), str(orchestration), str(constraints)) == 0
    assert orchestration.read_text().splitlines() == [
        "apache-airflow==3.3.2", "fastapi==0.136.3", 'numpy==2.3.5; python_full_version < "3.13"']
    lines = constraints.read_text().splitlines()
    assert lines[:2] == ["vllm==0.34.0", "torch==2.14.0"]
    assert "fastapi<0.137.0,>=0.133.0" in lines
    assert not any(line.startswith(("cachetools", "zentorch")) for line in lines)
