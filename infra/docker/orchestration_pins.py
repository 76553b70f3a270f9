"""What gpu-worker.Dockerfile installs beside the image's vLLM, written for uv:

    python3 orchestration_pins.py LOCK_PINS ORCHESTRATION CONSTRAINTS

LOCK_PINS is `uv export` of the orchestration extras (uv.lock's versions). ORCHESTRATION gets
those pins less every package this Python already has (the image's vLLM stack keeps its
versions where they serve); CONSTRAINTS gets vllm and torch at their installed versions and
every requirement the installed vllm declares (extras left out), so that the install can move
one of the image's packages only within what vLLM asks. Reads nothing but the installed
distributions' metadata; needs only `packaging` (vLLM's image has it).
"""

from __future__ import annotations

import importlib.metadata as md
import sys

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def main(lock_pins: str, orchestration: str, constraints: str) -> int:
    env = {**default_environment(), "extra": ""}
    have = {canonicalize_name(d.metadata["Name"]) for d in md.distributions()
            if d.metadata["Name"]}
    with open(lock_pins) as f:
        lock = [Requirement(line.split("#", 1)[0].strip()) for line in f
                if line.split("#", 1)[0].strip()]
    kept = [r for r in lock if canonicalize_name(r.name) not in have]
    with open(orchestration, "w") as f:
        f.writelines(f"{r}\n" for r in kept)
    cons = {"vllm": f"vllm=={md.version('vllm')}", "torch": f"torch=={md.version('torch')}"}
    for line in md.requires("vllm") or []:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if req.specifier and name not in cons and (req.marker is None
                                                    or req.marker.evaluate(env)):
            cons[name] = f"{req.name}{req.specifier}"
    with open(constraints, "w") as f:
        f.writelines(f"{c}\n" for c in cons.values())
    print(f"orchestration: {len(kept)} of {len(lock)} lock pins (the image has the rest); "
          f"constraints: {len(cons)} (vLLM {md.version('vllm')}'s requirements)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
