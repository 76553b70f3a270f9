"""A target and an EAGLE-3 drafter with real weights that agree the way a trained pair does.

Why: vLLM's adaptive verification ranks drafts by the drafter's own confidence (its top
probability) and verifies only what its step-cost budget buys. With dummy weights that
confidence is flat (1/vocab) and vLLM's synthetic acceptance ignores it, so adaptive
verification is judged on nothing (``benchmarks/results/h200-v033/README.md``). No trained pair
reaches the lent GPU (no network there, 64 MiB a call), so this one is built from a seed on the
GPU machine itself.

The construction (the CPU pair of ``tabletune.engine.model_pair``, rebuilt for EAGLE-3):
- The target is a Llama with Qwen3-4B's shapes (36 layers, hidden 2560, GQA 32/8 heads of
  128, MLP 9728) and seeded random weights. Its embeddings are small (``embed_rms``), so the
  residual stream after layer 0 is that layer's attention and MLP output; layer 0's queries are
  its keys, so it attends mostly to the token itself; layers 1..35 write into the stream scaled
  by ``residual_scale``: they move the logits a little, and the token changes where the top two
  logits were close.
- The drafter is vLLM's one-layer ``LlamaForCausalLMEagle3`` holding the target's layer 0: its
  query/key/value take the target layer 0's weights on the embedding half of their input, and
  its hidden half is switched off (``norm_before_residual`` with a zero ``hidden_norm``, so the
  fed-back hidden state neither enters the attention nor the residual). On the draft token it
  computes what the target's layer 0 computes on it, then the target's final norm and the first
  ``draft_vocab`` rows of the target's head. The target's head is zero on the other rows, so its
  greedy token always lies in the draft vocabulary.
- So the drafter is right where layers 1..35 do not flip the token, and least sure where they
  most easily do: its confidence carries information about acceptance, as a trained drafter's
  does. The verification is vLLM's real one (no synthetic acceptance).

Shapes decide the step time, so the target costs what the Qwen3-4B-shaped dummy target costs
(Llama has no q/k norm: a few microseconds a step less) and the drafter what the dummy EAGLE-3
drafter costs.

usage:
  python benchmarks/gpu/agreeing_pair.py OUT [--tokenizer DIR] [--device cuda] [--small]
  python benchmarks/gpu/agreeing_pair.py --check [--small] [--device cuda]   # agreement only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Design:
    hidden: int = 2560
    intermediate: int = 9728
    layers: int = 36
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    vocab: int = 151936
    draft_vocab: int = 32000
    # How much layers 1..L-1 write into the residual stream: sets the agreement. --check --small
    # (this depth, a CPU's width): 0.015 / 0.025 / 0.03 gave a_1..a_3 of 0.90/0.81/0.72,
    # 0.82/0.67/0.53 and 0.76/0.56/0.42, the last near the synthetic 0.75/0.55/0.40 of every
    # earlier run.
    residual_scale: float = 0.03
    # The standard deviation of the head's logits over the vocabulary: sets how sure the
    # drafter is of its top token.
    logit_std: float = 6.0
    embed_rms: float = 0.02
    # Layer 0's queries as its keys times this (0: independent): attention on the token itself
    # (and its repeats), so the drafter's cache missing the first token (EAGLE's shift) moves
    # little. With independent queries that alone held a_1 near 0.57-0.59 whatever the scale
    # (--check --small at 0.008 and 0.012).
    self_attention: float = 1.0
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    seed: int = 29


# The same depth and vocabulary at a width a CPU runs in seconds; the inits scale with fan-in,
# so the agreement carries over (checked: --check and --check --small).
SMALL = Design(hidden=512, intermediate=1536, heads=8, kv_heads=2, head_dim=64)
# Small enough for vLLM's CPU build: the pair's construction checked against vLLM's own EAGLE-3
# path (its acceptance counters against --check on the same design).
TINY = Design(hidden=256, intermediate=768, layers=8, heads=4, kv_heads=2, head_dim=64,
              vocab=4096, draft_vocab=2048, residual_scale=0.04)


def target_config(d: Design) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": d.hidden, "intermediate_size": d.intermediate,
        "num_hidden_layers": d.layers, "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads, "head_dim": d.head_dim, "vocab_size": d.vocab,
        "max_position_embeddings": 40960, "rope_theta": d.rope_theta,
        "rms_norm_eps": d.rms_norm_eps, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False,
        "bos_token_id": 1, "eos_token_id": 2, "use_cache": True,
    }


def drafter_config(d: Design) -> dict:
    return {
        **target_config(d), "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
        "draft_vocab_size": d.draft_vocab,
        # The fed-back hidden state is normalised by a zero-weight norm before it becomes the
        # residual: the drafter sees only the draft token (and its KV cache of earlier ones).
        "norm_before_residual": True,
    }


def build_weights(d: Design, device: str = "cpu"):
    """The target's and the drafter's tensors (float32, HF names) for design ``d``."""
    import torch

    g = torch.Generator(device=device).manual_seed(d.seed)

    def normal(*shape, std):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * std

    h, inter, q, kv = d.hidden, d.intermediate, d.heads * d.head_dim, d.kv_heads * d.head_dim
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(d.vocab, h, std=d.embed_rms)}
    for i in range(d.layers):
        scale = 1.0 if i == 0 else d.residual_scale
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = normal(q, h, std=h ** -0.5)
        t[p + "self_attn.k_proj.weight"] = normal(kv, h, std=h ** -0.5)
        if i == 0 and d.self_attention:
            k_heads = t[p + "self_attn.k_proj.weight"].view(d.kv_heads, d.head_dim, h)
            t[p + "self_attn.q_proj.weight"] = (d.self_attention * k_heads.repeat_interleave(
                d.heads // d.kv_heads, 0)).reshape(q, h).contiguous()
        t[p + "self_attn.v_proj.weight"] = normal(kv, h, std=h ** -0.5)
        t[p + "self_attn.o_proj.weight"] = normal(h, q, std=scale * q ** -0.5)
        t[p + "mlp.gate_proj.weight"] = normal(inter, h, std=h ** -0.5)
        t[p + "mlp.up_proj.weight"] = normal(inter, h, std=h ** -0.5)
        t[p + "mlp.down_proj.weight"] = normal(h, inter, std=scale * inter ** -0.5)
        t[p + "input_layernorm.weight"] = torch.ones(h, device=device)
        t[p + "post_attention_layernorm.weight"] = torch.ones(h, device=device)
    t["model.norm.weight"] = torch.ones(h, device=device)
    head = torch.zeros(d.vocab, h, device=device)
    # A normalised hidden state has unit RMS per dimension: head rows of std logit_std/sqrt(h)
    # give logits of std logit_std.
    head[: d.draft_vocab] = normal(d.draft_vocab, h, std=d.logit_std * h ** -0.5)
    t["lm_head.weight"] = head

    l0 = "model.layers.0."
    # No embedding of its own: vLLM gives the drafter the target's (eagle/utils.py,
    # maybe_share_target_embed), one copy on the GPU instead of two.
    dr = {
        "fc.weight": torch.zeros(h, 3 * h, device=device),
        "layers.0.hidden_norm.weight": torch.zeros(h, device=device),
        "layers.0.input_layernorm.weight": t[l0 + "input_layernorm.weight"],
        "layers.0.post_attention_layernorm.weight": t[l0 + "post_attention_layernorm.weight"],
        "layers.0.self_attn.o_proj.weight": t[l0 + "self_attn.o_proj.weight"],
        "layers.0.mlp.gate_proj.weight": t[l0 + "mlp.gate_proj.weight"],
        "layers.0.mlp.up_proj.weight": t[l0 + "mlp.up_proj.weight"],
        "layers.0.mlp.down_proj.weight": t[l0 + "mlp.down_proj.weight"],
        "norm.weight": t["model.norm.weight"],
        "lm_head.weight": head[: d.draft_vocab],
        "d2t": torch.zeros(d.draft_vocab, dtype=torch.int64, device=device),
    }
    for name in ("q_proj", "k_proj", "v_proj"):
        w = t[l0 + f"self_attn.{name}.weight"]
        # The layer's input is [norm(embedding), norm(hidden)]: the hidden half gets zeros.
        dr[f"layers.0.self_attn.{name}.weight"] = torch.cat([w, torch.zeros_like(w)], 1)
    return t, dr


def _rms(x, w, eps):
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _attention(t, i, x, d: Design, cos, sin):
    """Layer ``i``'s attention output on ``x`` [T, H] (causal, no cache)."""
    import torch

    p = f"model.layers.{i}."
    n = _rms(x, t[p + "input_layernorm.weight"], d.rms_norm_eps)
    T = x.shape[0]

    def heads(w, nh):
        y = (n @ w.T).view(T, nh, d.head_dim)
        y1, y2 = y[..., : d.head_dim // 2], y[..., d.head_dim // 2:]
        return y * cos + torch.cat([-y2, y1], -1) * sin

    qh = heads(t[p + "self_attn.q_proj.weight"], d.heads)
    kh = heads(t[p + "self_attn.k_proj.weight"], d.kv_heads)
    vh = (n @ t[p + "self_attn.v_proj.weight"].T).view(T, d.kv_heads, d.head_dim)
    rep = d.heads // d.kv_heads
    kh, vh = kh.repeat_interleave(rep, 1), vh.repeat_interleave(rep, 1)
    att = torch.einsum("qhd,khd->hqk", qh, kh) / math.sqrt(d.head_dim)
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
    att = att.masked_fill(causal, float("-inf"))
    a = torch.einsum("hqk,khd->qhd", att.softmax(-1), vh).reshape(T, -1)
    return a @ t[p + "self_attn.o_proj.weight"].T


def _mlp(t, i, x, d: Design):
    """Layer ``i``'s MLP output on the residual stream ``x`` (its own norm first)."""
    import torch

    p = f"model.layers.{i}."
    m = _rms(x, t[p + "post_attention_layernorm.weight"], d.rms_norm_eps)
    gate = m @ t[p + "mlp.gate_proj.weight"].T
    up = m @ t[p + "mlp.up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ t[p + "mlp.down_proj.weight"].T


def forward(t, ids, d: Design):
    """The target's logits and, per position, the drafter's logits for the same next token:
    the target's layer 0 with its residual stream started at zero instead of the embedding (as
    the EAGLE-3 layer runs it), the target's norm and the draft head. The drafter's KV cache in
    vLLM holds each position's next token (EAGLE's shift) and lacks the first token: check()
    runs this on the sequence without its first token for the drafter's side."""
    import torch

    T = len(ids)
    pos = torch.arange(T, device=t["lm_head.weight"].device, dtype=torch.float32)
    inv = 1.0 / d.rope_theta ** (torch.arange(0, d.head_dim, 2, device=pos.device) / d.head_dim)
    f = torch.outer(pos, inv)
    cos = torch.cat([f, f], -1).cos()[:, None, :]
    sin = torch.cat([f, f], -1).sin()[:, None, :]
    x = t["model.embed_tokens.weight"][torch.as_tensor(ids, device=pos.device)]
    draft_hidden = None
    for i in range(d.layers):
        attn = _attention(t, i, x, d, cos, sin)
        if i == 0:
            draft_hidden = attn + _mlp(t, 0, attn, d)
        x = x + attn
        x = x + _mlp(t, i, x, d)
    norm = t["model.norm.weight"]
    target_logits = _rms(x, norm, d.rms_norm_eps) @ t["lm_head.weight"].T
    draft_logits = _rms(draft_hidden, norm, d.rms_norm_eps) @ t["lm_head.weight"][: d.draft_vocab].T
    return target_logits, draft_logits


def check(d: Design, device: str = "cpu", prompts: int = 4, prompt_len: int = 16,
          new_tokens: int = 64) -> dict:
    """Greedy continuations of the target from random prompts; along them, how often the
    drafter's top token is the target's (per draft position, as k consecutive agreements), and
    how that rate rises with the drafter's top probability (quartiles)."""
    import torch

    t, _ = build_weights(d, device)
    t = {k: v.to(torch.bfloat16).float() for k, v in t.items()}  # as written and served
    rng = torch.Generator().manual_seed(d.seed + 1)
    agree_runs: list[list[bool]] = []
    conf, hit = [], []
    with torch.no_grad():
        for _ in range(prompts):
            ids = torch.randint(3, d.draft_vocab, (prompt_len,), generator=rng).tolist()
            for _ in range(new_tokens):
                tl, _dl = forward(t, ids, d)
                ids.append(int(tl[-1].argmax()))
            tl, _dl = forward(t, ids, d)
            # EAGLE's shift: the drafter's cache holds each token one position earlier and not
            # the first token, so its logits at j (token j + 1) predict token j + 2.
            _tl, dl = forward(t, ids[1:], d)
            # Target position i's logits predict token i + 1; keep the generated part.
            span = list(range(prompt_len - 1, len(ids) - 1))
            tgt = tl[span].argmax(-1)
            dft = dl[[i - 1 for i in span]].argmax(-1)
            top = dl[[i - 1 for i in span]].softmax(-1).max(-1).values
            agree = (tgt == dft).tolist()
            agree_runs.append(agree)
            conf += top.tolist()
            hit += agree
    per_position = []
    for k in (1, 2, 3):
        n = ok = 0
        for run in agree_runs:
            for i in range(len(run) - k + 1):
                n += 1
                ok += all(run[i:i + k])
        per_position.append(round(ok / n, 3))
    order = sorted(range(len(conf)), key=conf.__getitem__)
    quart = [order[j * len(order) // 4:(j + 1) * len(order) // 4] for j in range(4)]
    return {
        "design": asdict(d),
        "acceptance_per_position": per_position,
        "top_probability_quartiles": [round(sorted(conf)[int(q * (len(conf) - 1))], 3)
                                      for q in (0.1, 0.25, 0.5, 0.75, 0.9)],
        "agreement_by_confidence_quartile": [round(sum(hit[i] for i in qs) / len(qs), 3)
                                             for qs in quart],
        "tokens": len(conf),
    }


def write(out: Path, d: Design, tokenizer: Path, device: str = "cpu") -> None:
    """``out/target`` and ``out/eagle3`` with config, tokenizer and bf16 safetensors."""
    import torch
    from safetensors.torch import save_file

    t, dr = build_weights(d, device)
    # Written beside OUT and moved in whole: a run killed half-way leaves no half a pair that
    # the next run would refuse as "already there" (h200_launch makes it when it is missing).
    staging = out.parent / f".{out.name}.tmp{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    for name, tensors, config in (("target", t, target_config(d)),
                                  ("eagle3", dr, drafter_config(d))):
        folder = staging / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        for f in tokenizer.iterdir():
            if f.is_file() and f.name != "config.json":
                (folder / f.name).write_bytes(f.read_bytes())
        host = {k: (v if v.dtype == torch.int64 else v.to(torch.bfloat16)).contiguous().cpu()
                for k, v in tensors.items()}
        save_file(host, str(folder / "model.safetensors"))
        (folder / "tabletune_design.json").write_text(json.dumps(asdict(d), indent=2))
        del host
    out.mkdir(parents=True, exist_ok=True)
    for name in ("target", "eagle3"):
        os.replace(staging / name, out / name)
    staging.rmdir()
    print(f"agreeing pair in {out}: target, eagle3 ({json.dumps(asdict(d))})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--tokenizer", type=Path, help="a tokenizer folder to copy into both")
    ap.add_argument("--check", action="store_true", help="print the agreement and stop")
    ap.add_argument("--small", action="store_true", help="the full depth at a CPU's width")
    ap.add_argument("--tiny", action="store_true", help="a pair vLLM's CPU build serves")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--residual-scale", type=float)
    ap.add_argument("--logit-std", type=float)
    ap.add_argument("--self-attention", type=float)
    ap.add_argument("--new-tokens", type=int, default=64)
    a = ap.parse_args(argv)
    d = TINY if a.tiny else SMALL if a.small else Design()
    if a.residual_scale is not None:
        d = replace(d, residual_scale=a.residual_scale)
    if a.logit_std is not None:
        d = replace(d, logit_std=a.logit_std)
    if a.self_attention is not None:
        d = replace(d, self_attention=a.self_attention)
    problem = _bad_input(a, d)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if a.check:
        print(json.dumps(check(d, a.device, new_tokens=a.new_tokens)))
        return 0
    write(a.out, d, a.tokenizer, a.device)
    return 0


def _bad_input(a, d: Design) -> str | None:
    """What is wrong with the command line, before any weight is made; None if nothing."""
    for name, value in (("--residual-scale", d.residual_scale), ("--logit-std", d.logit_std),
                        ("--self-attention", d.self_attention)):
        if not (math.isfinite(value) and value >= 0):
            return f"{name}: {value}: must be a finite number >= 0"
    if not a.new_tokens >= 1:
        return f"--new-tokens: {a.new_tokens}: must be at least 1"
    if a.check:
        return None
    if a.out is None or a.tokenizer is None:
        return "OUT and --tokenizer are required unless --check"
    if not a.tokenizer.is_dir():
        return f"--tokenizer: {a.tokenizer}: not a folder"
    for name in ("target", "eagle3"):
        if (a.out / name).exists():  # nothing is overwritten: a pair is made once
            return f"{a.out / name}: already there"
    return None


if __name__ == "__main__":
    sys.exit(main())
