"""Which packages an offline bundle must bring to a machine that already has some installed.

    python3 bundle_delta.py --resolved NEW.json --reference OLD.json --image IMAGE.txt \
        --optional OPTIONAL.txt --pins OUT.txt

NEW.json / OLD.json are pip's installation reports (``pip install --dry-run --report``) of the
stack to bring (vLLM 0.33.0 + torch 2.14.0) and of the stack that already ran on that machine
(vLLM 0.26.0 + torch 2.11.0), both resolved for it (Python 3.12, Linux x86-64). IMAGE.txt is the
machine's installed list (``name==version``, or a bare name when the version is not known).
OPTIONAL.txt names packages the stack declares but does not import on the path it is used for
(``name  # why``). Writes the pins (``name==version``, sorted) and prints what was decided.

A resolved package is brought unless it is optional, only optional packages ask for it, or the
image has it and the image's copy serves: its known version meets every requirement the brought
packages place on it, or they ask no more of it than the reference stack asked (which ran on
the image's copy, whatever its version).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

# The machine the bundle is for: markers are evaluated for it, not for the Python running this.
TARGET_ENV = {"python_version": "3.12", "python_full_version": "3.12.3",
              "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
              "platform_machine": "x86_64", "implementation_name": "cpython",
              "platform_python_implementation": "CPython"}


@dataclass(frozen=True)
class Decision:
    name: str
    version: str           # the resolved version
    bring: bool
    reason: str


def resolved_packages(report: dict) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, Requires-Dist lines) from a pip installation report."""
    return {canonicalize_name(item["metadata"]["name"]):
            (item["metadata"]["version"], item["metadata"].get("requires_dist") or [])
            for item in report["install"]}


def requested_names(report: dict) -> set[str]:
    """What the report was asked to install (the roots: vllm, torch)."""
    return {canonicalize_name(item["metadata"]["name"]) for item in report["install"]
            if item.get("requested")}


def needed(packages: dict[str, tuple[str, list[str]]], roots: set[str],
           optional: dict[str, str]) -> set[str]:
    """The packages the roots reach through requirements, never passing an optional one."""
    edges = requirements_on(packages, set(packages), by_asker=True)
    seen, todo = set(), [r for r in roots if r not in optional]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(n for n in edges.get(name, ()) if n in packages and n not in optional)
    return seen


def requirements_on(packages: dict[str, tuple[str, list[str]]], among: set[str],
                    by_asker: bool = False) -> dict:
    """name -> [(asked by, specifier)] for what the packages in ``among`` require, with the
    extras their dependents ask for (``cuda-toolkit[cublas]`` pins nvidia-cublas); with
    ``by_asker``, asker -> the names it requires instead."""
    extras: dict[str, set[str]] = {name: {""} for name in packages}
    changed = True
    while changed:  # extras asked for can enable requirements that ask for more extras
        changed = False
        for name in among:
            for req in _active(packages[name][1], extras[name]):
                want = extras.setdefault(canonicalize_name(req.name), {""})
                if not set(req.extras) <= want:
                    want.update(req.extras)
                    changed = True
    out: dict = {}
    for name in among:
        for req in _active(packages[name][1], extras[name]):
            if by_asker:
                out.setdefault(name, set()).add(canonicalize_name(req.name))
            else:
                out.setdefault(canonicalize_name(req.name), []).append((name, req.specifier))
    return out


def _active(lines: list[str], extras: set[str]) -> list[Requirement]:
    reqs = []
    for line in lines:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({**TARGET_ENV, "extra": e})
                                     for e in extras):
            reqs.append(req)
    return reqs


def read_image(text: str) -> dict[str, str | None]:
    """``name==version`` or ``name`` per line (``#`` comments) -> name -> version or None."""
    image: dict[str, str | None] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            image[canonicalize_name(name.strip())] = version.strip() or None
    return image


def read_optional(text: str) -> dict[str, str]:
    """``name  # why`` per line -> name -> why."""
    out = {}
    for line in text.splitlines():
        name, _, why = line.partition("#")
        if name.strip():
            out[canonicalize_name(name.strip())] = why.strip()
    return out


def decide(resolved: dict[str, tuple[str, list[str]]], roots: set[str],
           reference: dict[str, tuple[str, list[str]]],
           image: dict[str, str | None], optional: dict[str, str]) -> list[Decision]:
    """Bring what the roots need and the image lacks or cannot serve; repeat until nothing more
    is kept from the image (keeping one drops its resolved version's requirements)."""
    ref_asked = {name: {str(s) for _, s in asked} for name, asked in
                 requirements_on(reference, set(reference)).items()}
    wanted = needed(resolved, roots, optional)
    kept: dict[str, str] = {}   # name -> why the image's copy serves
    while True:
        brought = {n for n in wanted if n not in kept}
        asked = requirements_on(resolved, brought)
        newly_kept = {}
        for name in brought & set(image):
            specs = {str(s) for _, s in asked.get(name, []) if str(s)}
            have = image[name]
            if have is not None and all(s.contains(Version(have), prereleases=True)
                                        for _, s in asked.get(name, [])):
                newly_kept[name] = f"image has {have}, which meets " + (
                    ", ".join(sorted(specs)) or "no version asked")
            elif specs <= ref_asked.get(name, set()) | {""}:
                # The reference stack ran on the image's copy asking the same (a version cap
                # the image's copy breaks, like mistral-common's numpy<2.4, did not matter).
                newly_kept[name] = f"image has {have or 'it (version unknown)'}; asked no " + \
                    "more than vLLM 0.26.0 + torch 2.11.0 asked: " + (
                        ", ".join(sorted(specs)) or "no version")
        # Keeping one copy can only drop requirements, never add: this settles in a few rounds.
        if not newly_kept:
            break
        kept.update(newly_kept)
    out = []
    for name, (version, _) in sorted(resolved.items()):
        if name in optional:
            out.append(Decision(name, version, False, f"optional here: {optional[name]}"))
        elif name not in wanted:
            out.append(Decision(name, version, False, "only optional packages ask for it"))
        elif name in kept:
            out.append(Decision(name, version, False, kept[name]))
        elif name in image and image[name]:
            out.append(Decision(name, version, True, f"image has {image[name]}, which does not "
                                "meet what the bundle asks"))
        elif name in image:
            out.append(Decision(name, version, True, "image has it (version unknown); the bundle "
                                "asks more than vLLM 0.26.0 + torch 2.11.0 did"))
        else:
            out.append(Decision(name, version, True, "image lacks it"))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolved", required=True)
    p.add_argument("--reference", required=True)
    p.add_argument("--image", required=True)
    p.add_argument("--optional", required=True)
    p.add_argument("--pins", required=True)
    args = p.parse_args()
    report = json.loads(Path(args.resolved).read_text())
    resolved = resolved_packages(report)
    reference = resolved_packages(json.loads(Path(args.reference).read_text()))
    image = read_image(Path(args.image).read_text())
    optional = read_optional(Path(args.optional).read_text())
    decisions = decide(resolved, requested_names(report), reference, image, optional)
    Path(args.pins).write_text("".join(f"{d.name}=={d.version}\n"
                                       for d in decisions if d.bring))
    for d in decisions:
        print(f"{'bring' if d.bring else 'leave'}  {d.name}=={d.version}  ({d.reason})")
    nvidia = [d for d in decisions if d.name.startswith(("nvidia-", "cuda-"))]
    print(f"{sum(d.bring for d in decisions)} of {len(decisions)} resolved packages brought; "
          f"CUDA packages (nvidia-*, cuda-*): {sum(d.bring for d in nvidia)} of {len(nvidia)} "
          "brought")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
