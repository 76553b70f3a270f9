"""The embedded default: a small target/drafter pair built locally (no hub), cached on disk.

The target is a random-weight Llama whose layers 1..L-1 write only a little into the residual
stream (their ``o_proj``/``down_proj`` are scaled down). The drafter is the target's layer 0 with
the target's embeddings, final norm and head, so it agrees with the target most of the time — the
way a real drafter does — and costs roughly 1/L of a target step. The scale sets the agreement.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from tabletune.core import envs
from tabletune.core.atomic import atomic_replace, atomic_write_text

PAIR_FORMAT_VERSION = 1

log = logging.getLogger("tabletune.engine")


@dataclass(frozen=True)
class PairDesign:
    hidden_size: int = 1024
    intermediate_size: int = 2816
    num_layers: int = 12
    num_heads: int = 16
    vocab_size: int = 2048
    residual_scale: float = 0.03
    max_position_embeddings: int = 2048
    seed: int = 1234

    def key(self) -> str:
        blob = json.dumps({"v": PAIR_FORMAT_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class ModelPair:
    target: Path
    drafter: Path
    design: PairDesign


def default_cache_dir() -> Path:
    return Path(envs.CACHE.get() or os.path.join(envs.cache_home(), "tabletune"))


# A closed vocabulary of made-up words keeps the corpus, the tokenizer and the prompts
# deterministic and independent of anything downloaded.
_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "st", "tr", "pl", "gr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st"]


def _lexicon(rng: random.Random, size: int = 900) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        n = rng.choice([1, 1, 2, 2, 2, 3])
        words.add("".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(n)))
    return sorted(words)


def synthetic_sentences(count: int, seed: int = 7) -> list[str]:
    """Zipf-distributed made-up words in sentences of 6-24 words."""
    rng = random.Random(seed)
    lexicon = _lexicon(random.Random(99))
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]
    sentences = []
    for _ in range(count):
        n = rng.randint(6, 24)
        words = rng.choices(lexicon, weights=weights, k=n)
        sentences.append(" ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!"]))
    return sentences


def synthetic_prompts(count: int, *, seed: int = 11, approx_words: int = 24) -> list[str]:
    """Prompts of roughly 32 tokens for the embedded pair's tokenizer."""
    rng = random.Random(seed)
    pool = synthetic_sentences(count * 4, seed=seed)
    prompts = []
    for _ in range(count):
        words: list[str] = []
        while len(words) < approx_words:
            words.extend(rng.choice(pool).split())
        prompts.append(" ".join(words[:approx_words]))
    return prompts


def _train_tokenizer(out_dir: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(synthetic_sentences(20000), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(out_dir)


@contextlib.contextmanager
def _quiet_transformers_progress():
    """transformers' tqdm bars off for the block, then back as they were."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def build_pair(design: PairDesign = PairDesign(), cache_dir: Path | None = None) -> ModelPair:
    """Build (once) and return the target and drafter folders for ``design``."""
    root = (cache_dir or default_cache_dir()) / "models" / f"pair-{design.key()}"
    pair = ModelPair(target=root / "target", drafter=root / "drafter", design=design)
    if (root / "READY").exists():
        return pair

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    staging = root.with_name(root.name + f".tmp{os.getpid()}")
    if staging.exists():
        import shutil

        shutil.rmtree(staging)
    tok_dir = staging / "tokenizer"
    _train_tokenizer(tok_dir, design.vocab_size)

    torch.manual_seed(design.seed)
    config = LlamaConfig(
        vocab_size=design.vocab_size,
        hidden_size=design.hidden_size,
        intermediate_size=design.intermediate_size,
        num_hidden_layers=design.num_layers,
        num_attention_heads=design.num_heads,
        num_key_value_heads=design.num_heads,
        max_position_embeddings=design.max_position_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    target = LlamaForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(design.residual_scale)
            layer.mlp.down_proj.weight.mul_(design.residual_scale)

    draft_config = LlamaConfig(**{**config.to_dict(), "num_hidden_layers": 1})
    drafter = LlamaForCausalLM(draft_config).to(torch.float32).eval()
    with torch.no_grad():
        drafter.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        drafter.model.norm.weight.copy_(target.model.norm.weight)
        drafter.lm_head.weight.copy_(target.lm_head.weight)
        drafter.model.layers[0].load_state_dict(target.model.layers[0].state_dict())

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    log.info("building the embedded model pair once: target and drafter weights into %s", root)
    for model, name in ((target, "target"), (drafter, "drafter")):
        with _quiet_transformers_progress():  # its "Writing model shards" bar, one per model
            model.save_pretrained(staging / name, safe_serialization=True)
        tokenizer.save_pretrained(staging / name)
        (staging / name / "tabletune_design.json").write_text(json.dumps(asdict(design), indent=2))
    (staging / "READY").write_text(design.key())
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_replace(staging, root)
    except OSError:
        # Another process finished first; its copy is identical.
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    return pair


def greedy_agreement(pair: ModelPair, num_prompts: int = 8, new_tokens: int = 48) -> float:
    """How often the drafter's greedy token equals the target's along the target's own greedy
    continuation — the pair's designed first-position acceptance. Computed once, then cached."""
    cache = pair.target.parent / "agreement.json"
    if cache.exists():
        return float(json.loads(cache.read_text())["greedy_agreement"])
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pair.target)
    target = AutoModelForCausalLM.from_pretrained(pair.target).eval()
    drafter = AutoModelForCausalLM.from_pretrained(pair.drafter).eval()
    agree = total = 0
    with torch.no_grad():
        for prompt in synthetic_prompts(num_prompts, seed=3):
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            seq = target.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                                  min_new_tokens=new_tokens)
            n = ids.shape[1]
            t = target(seq).logits.argmax(-1)[0, n - 1:-1]
            d = drafter(seq).logits.argmax(-1)[0, n - 1:-1]
            agree += int((t == d).sum())
            total += int(t.numel())
    value = agree / total
    atomic_write_text(cache, json.dumps({"greedy_agreement": value, "tokens": total}))
    return value
