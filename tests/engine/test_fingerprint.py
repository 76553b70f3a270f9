"""The deployment fingerprint in its one module (tabletune.engine.fingerprint): the key, what
changed, which differences a prior is refused for, and what evaluate notes of a table tuned
elsewhere."""

from tabletune.engine.fingerprint import (
    deployment_differences,
    engine_fingerprint,
    fingerprint_changes,
    fingerprint_key,
    fingerprint_mismatches,
    same_model,
)

RECORDED = {"engine": "vllm", "engine_version": "0.32.0", "device": "cuda", "model": "/m#abc",
            "tensor_parallel_size": 1, "max_num_seqs": 64}


def test_the_key_ignores_field_order_and_changes_with_any_value():
    assert fingerprint_key(RECORDED) == fingerprint_key(dict(reversed(RECORDED.items())))
    assert fingerprint_key(RECORDED) != fingerprint_key({**RECORDED, "max_num_seqs": 128})
    assert len(fingerprint_key(RECORDED)) == 16


def test_changes_name_each_field_with_both_values():
    assert fingerprint_changes(RECORDED, {**RECORDED, "engine_version": "0.33.0"}) == {
        "engine_version": {"old": "0.32.0", "new": "0.33.0"}}
    assert fingerprint_changes(None, {"device": "cpu"}) == {"device": {"old": None,
                                                                      "new": "cpu"}}


def test_mismatches_count_only_known_fields_both_sides_know():
    engine = {"engine": "vllm", "engine_version": "0.33.0", "device": "cuda", "model": "/m/",
              "max_num_seqs": 256}
    assert fingerprint_mismatches(RECORDED, engine) == [
        "prior profile.fingerprint.engine_version: '0.32.0' but the engine has '0.33.0'"]
    assert same_model("/m#abc", "/m/") and not same_model("/m#abc", "/m#def")


def test_the_running_engine_side_leaves_out_what_it_cannot_read():
    class Config:
        model_config = type("M", (), {"model": "/nowhere/target"})()
        parallel_config = type("P", (), {"tensor_parallel_size": 2})()

    fp = engine_fingerprint(Config(), want_gpu=False)
    assert fp["model"] == "/nowhere/target" and fp["tensor_parallel_size"] == 2
    assert "drafter" not in fp and "device" not in fp


def test_differences_name_each_known_field_and_each_sides_own_engine_arguments():
    tuned = {**RECORDED, "gpu": "NVIDIA H200", "driver": "unknown",
             "extra_args": ["--load-format=dummy", "--max-cudagraph-capture-size=1024"]}
    here = {**RECORDED, "model": "/m/#abc", "driver": "580.159.04",
            "extra_args": ["--load-format=dummy",
                           '--compilation-config={"cudagraph_mode":"FULL"}'],
            "gpu": "NVIDIA H100 80GB HBM3"}
    assert deployment_differences(tuned, here) == [
        'extra_args: --max-cudagraph-capture-size=1024 only in the tune; '
        '--compilation-config={"cudagraph_mode":"FULL"} only here',
        "gpu: 'NVIDIA H200' in the tune, 'NVIDIA H100 80GB HBM3' here"]
    # The same deployment (a model path written two ways, a field one side lacks): nothing.
    assert deployment_differences(RECORDED, {**RECORDED, "model": "/m/", "cpu": "x"}) == []
