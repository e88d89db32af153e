"""Build a tiny, deterministic Llama base model + tokenizer, and random PEFT LoRA adapters for it.

The recipe (docs/vllm-cpu.md, "The tiny model"): a byte-level BPE padded to 1,024 ids, a 4-layer
Llama (hidden 256, head dim 64, 2.9 M params, ~12 MB fp32) whose matrices are redrawn from N(0, 0.08) so
greedy output is not degenerate. vLLM serves the folder with `--model <dir> --served-model-name tiny-llama`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from demo.tasks import corpus_texts

DEFAULT_SERVED_NAME = "tiny-llama"
VOCAB_SIZE = 1024
BOS, EOS, UNK, PAD = "<s>", "</s>", "<unk>", "<pad>"
SPECIAL_TOKENS = (BOS, EOS, UNK, PAD)  # ids 0..3, in this order
BASE_METADATA_FILE = "quiver_base.json"

# One user message renders to BOS + its content, i.e. exactly the token ids of the plain completion prompt:
# vLLM's chat endpoint tokenizes the rendered text with add_special_tokens=False (the template owns BOS),
# its completion endpoint with add_special_tokens=True (the post-processor adds BOS).
# A chat with ``tools`` gets them as a Llama 3.1 style template renders them: a system preamble (Llama 3.1's own
# words) and each tool as indented JSON, about 300 + 110 tokens that are not in the request's bytes. The suite's
# engine then shows what a real tool-calling template does to a prompt's count (the gateway's billing cap,
# ``inference.gateway.exchange.usage_bounded``); chats without tools render as before.
TOOLS_PREAMBLE = (
    "Environment: tools\nCutting Knowledge Date: December 2023\n\nYou are a helpful assistant with tool calling "
    "capabilities. When you receive a tool call response, use the output to format an answer to the original user "
    "question.\n\nGiven the following functions, please respond with a JSON for a function call with its proper "
    "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
    "dictionary of argument name and its value}. Do not use variables.\n\n")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if tools %}{{ preamble }}{% for tool in tools %}{{ tool | tojson(indent=4) }}{{ '\\n\\n' }}"
    "{% endfor %}{% endif %}{% for message in messages %}{{ message['content'] }}{% endfor %}"
).replace("{{ preamble }}", "{{ " + json.dumps(TOOLS_PREAMBLE) + " }}")

_WORDS = (
    "the a an one two three red blue green big small old new fast slow good bad cat dog bird fish tree "
    "house car road river hill city town king queen man woman child book lamp door table chair sun moon "
    "star sky rain snow wind fire water milk bread apple runs walks sees finds likes eats reads and"
).split()

# Pseudo-words give BPE enough merges to fill the whole vocabulary with real text pieces, so the random
# base model babbles word fragments instead of `<extra_i>` padding tokens.
_SYLLABLES = (
    "ba be bi bo bu da de di do du ka ke ki ko ku la le li lo lu ma me mi mo mu na ne ni no nu "
    "ra re ri ro ru sa se si so su ta te ti to tu va ve vi vo"
).split()

_MODEL_KWARGS: dict[str, int | float | bool] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}
_INIT_STD = 0.08
_ADAPTER_INIT_SCALE = 0.3


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run torch on one intra-op thread inside the block, restoring the previous count after.

    Why: the model is tiny, so thread sync costs more than it saves (on a busy 2-core machine, 1 thread
    was ~10× faster than 2), and one thread fixes the float summation order, so builds are
    byte-identical on any machine with the same CPU kernels.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def recipe() -> dict[str, object]:
    """Return the parameters that define the base model, for cache keys (see `demo.assets`).

    Returns:
        A JSON-serialisable dict; any change to it must invalidate cached artifacts.
    """
    return {
        "model": _MODEL_KWARGS,
        "init_std": _INIT_STD,
        "words": list(_WORDS),
        "syllables": list(_SYLLABLES),
        "special_tokens": list(SPECIAL_TOKENS),
        "chat_template": CHAT_TEMPLATE,
        "corpus_task_texts": corpus_texts(),
    }


def _corpus(seed: int) -> list[str]:
    """Return the BPE training corpus: random sentences plus every task text and its pieces.

    Args:
        seed: Seed for the sentence generator.

    Returns:
        About 3,400 lines covering lowercase/capitalised/UPPERCASE words, digits, `+`, `=`, `:` and
        pseudo-words.
    """
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 10))) for _ in range(2000)]
    lines += [
        " ".join("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(8))
        for _ in range(1000)
    ]
    lines += [w.upper() + " " + w.capitalize() for w in _WORDS]
    lines += [f"{a}+{b}={a + b}" for a in range(10) for b in range(10)]
    # Repeat task texts so their words become whole tokens (shorter sequences train faster).
    lines += corpus_texts() * 20
    return lines


def build_tokenizer(seed: int = 0) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer, padded to `VOCAB_SIZE` ids.

    Args:
        seed: Seed for the corpus sentences (the BPE trainer itself is deterministic).

    Returns:
        A fast tokenizer with `<s> </s> <unk> <pad>` at ids 0..3, a BOS post-processor and the chat
        template. Should BPE learn fewer than `VOCAB_SIZE` ids, the rest become plain added tokens
        `<extra_i>`, so every id still decodes to non-empty text.
    """
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)]
    )
    trained = tok.get_vocab_size()
    tok.add_tokens([f"<extra_{i}>" for i in range(VOCAB_SIZE - trained)])
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} ids, expected {VOCAB_SIZE}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        model_max_length=int(_MODEL_KWARGS["max_position_embeddings"]),
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_base_model(out_dir: Path, *, served_name: str = DEFAULT_SERVED_NAME, seed: int = 0) -> Path:
    """Write a tiny Llama HF model folder that vLLM and transformers can load offline.

    Args:
        out_dir: Destination folder, created if missing; existing files with the same names are overwritten.
        served_name: Name vLLM will serve it under (`--served-model-name`); recorded in
            `quiver_base.json` and used as adapters' `base_model_name_or_path`.
        seed: Seed for the tokenizer corpus and the weights. Same seed → byte-identical weights.

    Returns:
        `out_dir`, holding config.json, model.safetensors (~12 MB fp32), generation_config.json,
        tokenizer.json, tokenizer_config.json (with the chat template) and quiver_base.json.
    """
    with one_torch_thread():
        _build_base_model(out_dir, served_name=served_name, seed=seed)
    return out_dir


def _build_base_model(out_dir: Path, *, served_name: str, seed: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(seed)
    config = LlamaConfig(
        **_MODEL_KWARGS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            # Norm weights (1-D) stay at 1; only matrices are redrawn, in a fixed (sorted) order.
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=gen) * _INIT_STD)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    (out_dir / BASE_METADATA_FILE).write_text(
        json.dumps({"served_name": served_name, "seed": seed}, indent=2) + "\n"
    )
    _make_world_readable(out_dir)


def _make_world_readable(folder: Path) -> None:
    # safetensors writes 0600; a vLLM node running as another user must still read the files.
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o644)


def load_base(base_dir: Path) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """Load the base model (fp32, eval mode) and tokenizer written by `build_base_model`.

    Args:
        base_dir: Folder returned by `build_base_model`.

    Returns:
        `(model, tokenizer)`.
    """
    model = LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model.eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(base_dir)
    return model, tokenizer


def served_name_of(base_dir: Path) -> str:
    """Return the served name recorded by `build_base_model` (default `tiny-llama` if absent)."""
    meta = base_dir / BASE_METADATA_FILE
    if not meta.exists():
        return DEFAULT_SERVED_NAME
    return str(json.loads(meta.read_text())["served_name"])


def save_adapter(peft_model: PeftModel, out_dir: Path, *, served_name: str) -> Path:
    """Save a PEFT LoRA adapter the way vLLM expects it.

    Writes `adapter_config.json` (with `base_model_name_or_path` = `served_name`, which vLLM's
    filesystem resolver and `validate_legal` compare to the served model name) and
    `adapter_model.safetensors`, with no embedding layers.

    Args:
        peft_model: The PEFT model holding the `default` adapter.
        out_dir: Destination folder, created if missing.
        served_name: The base model's served name.

    Returns:
        `out_dir`.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    peft_model.peft_config["default"].base_model_name_or_path = served_name
    peft_model.save_pretrained(out_dir, safe_serialization=True, save_embedding_layers=False)
    # PEFT may overwrite the field from the base model's path while saving; pin it afterwards too.
    cfg_path = out_dir / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = served_name
    if isinstance(cfg.get("target_modules"), list):  # PEFT writes a set: order follows PYTHONHASHSEED
        cfg["target_modules"] = sorted(cfg["target_modules"])
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    _make_world_readable(out_dir)
    return out_dir


def make_random_adapter(
    base_dir: Path,
    out_dir: Path,
    *,
    r: int,
    lora_alpha: int,
    target_modules: list[str],
    seed: int,
    use_rslora: bool = False,
) -> Path:
    """Write a LoRA adapter with random (non-zero) A and B, for engine-vs-reference equality tests.

    PEFT initialises B to zero (a no-op adapter), so both A and B are redrawn as seeded randn × 0.3
    (notes §9).

    Args:
        base_dir: Folder from `build_base_model`.
        out_dir: Destination folder.
        r: LoRA rank.
        lora_alpha: LoRA alpha (scale = alpha / r, or alpha / sqrt(r) with rsLoRA).
        target_modules: Llama projection names, e.g. `["q_proj", "v_proj"]`.
        seed: Seed for A and B.
        use_rslora: Use rank-stabilised scaling.

    Returns:
        `out_dir`, holding adapter_config.json and adapter_model.safetensors.
    """
    model, _ = load_base(base_dir)
    config = LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        target_modules=list(target_modules),
        lora_dropout=0.0,
        use_rslora=use_rslora,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(peft_model.named_parameters()):
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * _ADAPTER_INIT_SCALE)
    return save_adapter(peft_model, out_dir, served_name=served_name_of(base_dir))
