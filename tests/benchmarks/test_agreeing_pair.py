"""benchmarks/gpu/agreeing_pair.py: the EAGLE-3 drafter's tensors compute what the target's
layer 0 computes, so its top token is the target's where layers 1..L-1 do not flip it, and its
confidence says how likely that is."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from benchmark_scripts import load_script

torch = pytest.importorskip("torch")
agreeing_pair = load_script("agreeing_pair.py")

# Smaller than TINY: a test runs in about a second.
MICRO = replace(agreeing_pair.TINY, hidden=64, intermediate=192, layers=4, heads=4, kv_heads=2,
                head_dim=16, vocab=512, draft_vocab=256)


def _rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _eagle3_logits(dr, d, embeds, fed_back_hidden):
    """vLLM 0.32/0.33's llama_eagle3 layer 0 (norm_before_residual) and head on a single
    position, written from its source: the drafter as vLLM runs it, not as check() assumes."""
    e = _rms(embeds, dr["layers.0.input_layernorm.weight"])
    h = _rms(fed_back_hidden, dr["layers.0.hidden_norm.weight"])
    residual = h  # norm_before_residual: the residual is the normalised hidden state
    x = torch.cat([e, h], -1)
    v = x @ dr["layers.0.self_attn.v_proj.weight"].T
    # One position attends only to itself: the output is its value, repeated per query group.
    attn = v.view(d.kv_heads, d.head_dim).repeat_interleave(d.heads // d.kv_heads, 0).reshape(-1)
    attn = attn @ dr["layers.0.self_attn.o_proj.weight"].T
    residual = residual + attn
    m = _rms(residual, dr["layers.0.post_attention_layernorm.weight"])
    mlp = (torch.nn.functional.silu(m @ dr["layers.0.mlp.gate_proj.weight"].T)
           * (m @ dr["layers.0.mlp.up_proj.weight"].T)) @ dr["layers.0.mlp.down_proj.weight"].T
    return _rms(residual + mlp, dr["norm.weight"]) @ dr["lm_head.weight"].T


def test_drafter_as_vllm_runs_it_equals_the_targets_layer_zero():
    t, dr = agreeing_pair.build_weights(MICRO)
    token = 7
    embed = t["model.embed_tokens.weight"][token]
    _target_logits, draft_logits = agreeing_pair.forward(t, [token], MICRO)
    # Whatever hidden state vLLM feeds back, the zero hidden_norm takes it out.
    for fed_back in (torch.zeros(MICRO.hidden), torch.randn(MICRO.hidden) * 5):
        got = _eagle3_logits(dr, MICRO, embed, fed_back)
        assert torch.allclose(got, draft_logits[0], atol=1e-4), (got - draft_logits[0]).abs().max()


def test_target_greedy_token_always_lies_in_the_draft_vocabulary():
    t, dr = agreeing_pair.build_weights(MICRO)
    assert dr["lm_head.weight"].shape == (MICRO.draft_vocab, MICRO.hidden)
    assert bool((t["lm_head.weight"][MICRO.draft_vocab:] == 0).all())
    target_logits, _ = agreeing_pair.forward(t, list(range(3, 40)), MICRO)
    assert int(target_logits.argmax(-1).max()) < MICRO.draft_vocab
    # The drafter's own embedding is left out: vLLM shares the target's.
    assert not any("embed_tokens" in name for name in dr)
    assert bool((dr["d2t"] == 0).all()) and dr["d2t"].dtype == torch.int64


def test_residual_scale_sets_the_agreement_and_confidence_tracks_it():
    low = agreeing_pair.check(replace(MICRO, residual_scale=0.01), prompts=2, new_tokens=24)
    high = agreeing_pair.check(replace(MICRO, residual_scale=0.3), prompts=2, new_tokens=24)
    a_low, a_high = low["acceptance_per_position"], high["acceptance_per_position"]
    assert a_low[0] > a_high[0]
    assert a_low == sorted(a_low, reverse=True) and a_high == sorted(a_high, reverse=True)
    q = high["agreement_by_confidence_quartile"]
    assert q[-1] > q[0]  # the surest quarter of drafts is right more often than the least sure


def test_write_gives_vllm_folders(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    agreeing_pair.write(tmp_path / "pair", MICRO, tok)
    target = json.loads((tmp_path / "pair/target/config.json").read_text())
    drafter = json.loads((tmp_path / "pair/eagle3/config.json").read_text())
    assert target["architectures"] == ["LlamaForCausalLM"] and not target["tie_word_embeddings"]
    assert drafter["architectures"] == ["LlamaForCausalLMEagle3"]
    assert drafter["norm_before_residual"] is True
    assert drafter["draft_vocab_size"] == MICRO.draft_vocab and drafter["num_hidden_layers"] == 1
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / "pair/eagle3/model.safetensors"))
    assert tensors["layers.0.self_attn.q_proj.weight"].shape == (
        MICRO.heads * MICRO.head_dim, 2 * MICRO.hidden)
    assert tensors["layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    assert (tmp_path / "pair/target/tokenizer.json").read_text() == "{}"
    assert math.isclose(json.loads((tmp_path / "pair/target/tabletune_design.json").read_text())
                        ["residual_scale"], MICRO.residual_scale)


@pytest.mark.parametrize("args, message", [
    ([], "OUT and --tokenizer are required"),
    (["--check", "--residual-scale", "nan"], "--residual-scale: nan"),
    (["--check", "--logit-std", "-1"], "--logit-std: -1.0"),
    (["--check", "--new-tokens", "0"], "--new-tokens: 0"),
    (["{tmp}/pair", "--tokenizer", "{tmp}/missing"], "--tokenizer: {tmp}/missing: not a folder"),
    (["{tmp}", "--tokenizer", "{tmp}"], "{tmp}/target: already there"),
])
def test_bad_input_is_exit_2_naming_it_and_writes_nothing(tmp_path, capsys, args, message):
    (tmp_path / "target").mkdir()
    before = sorted(tmp_path.rglob("*"))
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert agreeing_pair.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message.replace("{tmp}", str(tmp_path)) in err
    assert sorted(tmp_path.rglob("*")) == before
