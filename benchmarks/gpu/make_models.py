"""Write a Qwen3-4B-shaped target and its drafters for ``--load-format dummy`` runs.

Step time depends on shapes, not weights, so the folders hold only a config and a tokenizer
(trained locally by TableTune's model-pair code); vLLM fills random weights at load time.

- ``target``: Qwen3-4B shapes (36 layers, hidden 2560, bf16).
- ``eagle3``: a one-layer EAGLE-3 drafter for that target (``method: eagle3``, V2 runner).
- ``drafter``: a one-layer Qwen3 of the same shape (``method: draft_model``, V1 runner only).
usage: python benchmarks/gpu/make_models.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

QWEN3_4B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "use_cache": True,
}

# The shape of published EAGLE-3 heads for Qwen3-4B: one Llama decoder layer over the target's
# hidden size, fed three of the target's layers, with a reduced draft vocabulary.
EAGLE3_FOR_QWEN3_4B = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
    "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 1,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "draft_vocab_size": 32000, "max_position_embeddings": 40960,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
}


def main(out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tabletune.engine.model_pair import _train_tokenizer

    tok = out / "tokenizer"
    _train_tokenizer(tok, 2048)
    configs = {"target": QWEN3_4B, "drafter": {**QWEN3_4B, "num_hidden_layers": 1},
               "eagle3": EAGLE3_FOR_QWEN3_4B}
    for name, config in configs.items():
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(config, indent=2))
        for f in tok.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
    print(f"models in {out}: {', '.join(configs)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
