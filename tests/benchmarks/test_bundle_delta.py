"""benchmarks/staging/bundle_delta.py: what an offline bundle brings to a machine that has some
packages already, on a stand-in resolution shaped like pip's installation report."""

from __future__ import annotations

from benchmark_scripts import STAGING, load_script

bundle_delta = load_script("bundle_delta.py", STAGING)


def _report(*packages):
    return {"install": [{"metadata": {"name": name, "version": version, "requires_dist": reqs},
                         "requested": requested}
                        for name, version, reqs, requested in packages]}


NEW = _report(
    ("vllm", "0.33.0", ["torch==2.14.0", "numpy<2.4,>=1.25", "aiohttp>=3.14.4",
                        "tilelang==0.1.12", 'six>=1.16; python_version > "3.11"',
                        'winonly; sys_platform == "win32"'], True),
    ("torch", "2.14.0", ["cuda-toolkit[cublas]==13.0.3", "nvidia-nvshmem-cu13==3.4.5"], True),
    ("cuda-toolkit", "13.0.3", ["nvidia-cublas==13.1.1.3.*; extra == 'cublas'",
                                "nvidia-cuda-nvcc==13.0.88.*; extra == 'nvcc'"], False),
    ("nvidia-cublas", "13.1.1.3", [], False),
    ("nvidia-nvshmem-cu13", "3.4.5", [], False),
    ("numpy", "2.3.5", [], False),
    ("aiohttp", "3.14.5", [], False),
    ("six", "1.17.0", [], False),
    ("tilelang", "0.1.12", ["nvidia-cuda-nvcc>=13.0.48"], False),
    ("nvidia-cuda-nvcc", "13.5.37", [], False),
)
REFERENCE = _report(("vllm", "0.26.0", ["numpy<2.4,>=1.25", "aiohttp>=3.13.3",
                                          'six>=1.16; python_version > "3.11"'], True))
IMAGE = bundle_delta.read_image("""# comment
torch==2.11.0
numpy==2.5.2
aiohttp
six
cuda-toolkit==13.0.2
nvidia-cublas==13.1.0.3
nvidia-nvshmem-cu13==3.4.5
""")


def _decisions():
    resolved = bundle_delta.resolved_packages(NEW)
    return {d.name: d for d in bundle_delta.decide(
        resolved, bundle_delta.requested_names(NEW), bundle_delta.resolved_packages(REFERENCE),
        IMAGE, {"tilelang": "imported inside functions"})}


def test_only_what_the_image_lacks_or_cannot_serve_is_brought():
    d = _decisions()
    assert sorted(n for n, x in d.items() if x.bring) == [
        "aiohttp", "cuda-toolkit", "nvidia-cublas", "torch", "vllm"]
    assert d["torch"].reason == "image has 2.11.0, which does not meet what the bundle asks"
    # an extra asked by a dependent (cuda-toolkit[cublas]) pins its library
    assert d["nvidia-cublas"].bring
    assert d["nvidia-nvshmem-cu13"].reason == "image has 3.4.5, which meets ==3.4.5"
    # unknown version, asked more than the stack that ran on it: brought
    assert "asks more than vLLM 0.26.0" in d["aiohttp"].reason


def test_a_cap_the_old_stack_ran_past_keeps_the_images_copy():
    d = _decisions()
    assert not d["numpy"].bring and "asked no more than" in d["numpy"].reason


def test_optional_packages_and_what_only_they_ask_for_stay_out():
    d = _decisions()
    assert d["tilelang"].reason == "optional here: imported inside functions"
    assert d["nvidia-cuda-nvcc"].reason == "only optional packages ask for it"


def test_markers_are_evaluated_for_the_target_not_this_python():
    d = _decisions()
    # six is asked only under python_version > "3.11": for the 3.12 target it is needed (and
    # the image serves it); read for this 3.11 Python it would be asked by nothing
    assert not d["six"].bring and "asked no more than" in d["six"].reason
    assert "winonly" not in d
