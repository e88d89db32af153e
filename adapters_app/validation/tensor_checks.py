"""Checking an adapter's tensors against the registered base model's shapes.

Every tensor must be one half of a LoRA pair on a real module of the base:
``lora_A`` ``[r, in_features]`` and ``lora_B`` ``[out_features, r]`` (PEFT
``lora/layer.py`` ``Linear.update_layer``: ``nn.Linear(in, r)`` and
``nn.Linear(r, out)``, whose weights are stored transposed); embedding LoRA is
``lora_embedding_A`` ``[r, vocab]`` and ``lora_embedding_B`` ``[hidden, r]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from adapters_app.validation.base_model import BaseModelFacts
from adapters_app.validation.collector import ProblemCollector
from adapters_app.validation.config import AdapterConfig
from adapters_app.validation.naming import TensorName, parse_tensor_name
from adapters_app.validation.problems import Problem, error
from adapters_app.validation.safetensors_header import TensorInfo

ALLOWED_DTYPES = frozenset({"F16", "BF16", "F32"})
#: Fused projection names used by other architectures (Phi-3 ``qkv_proj``/``gate_up_proj``,
#: GPT-NeoX/GLM ``query_key_value``, Phi-1.5 ``Wqkv``, GPT-2 ``c_attn``, Falcon/NeoX ``dense_h_to_4h``).
FUSED_NAMES = frozenset(
    {"qkv_proj", "gate_up_proj", "query_key_value", "Wqkv", "c_attn", "dense_h_to_4h", "W_pack"}
)
_RETRAIN = (
    "Train the adapter on the registered base model ({base}) with PEFT, targeting its modules ({mods})."
)


@dataclass
class TensorCheckResult:
    """Output of :func:`check_tensors`.

    Attributes:
        pairs: Module path -> ``{"lora_A": TensorInfo, "lora_B": TensorInfo}`` for mapped, shape-correct pairs.
        b_tensors: Per pair, the half PEFT initialises to zero (``lora_B``; ``lora_embedding_A`` for
            embeddings, PEFT ``lora/layer.py`` ``Embedding.reset_lora_parameters``): all zeros means untrained.
        shape_mismatches: Pairs whose shapes don't fit the base.
        rank_mismatches: Pairs that fit the base but whose rank disagrees with the config or between A and B
            (an adapter problem, not a base-model one).
        variant_pairs: Pairs that fit but are spelled so the engine would not load them.
        facts: ``tensor_count``, ``lora_pairs``, ``lora_modules``, ``layers_with_lora``, ``effective_ranks``, ``dtypes``.
    """

    pairs: dict[str, dict[str, TensorInfo]] = field(default_factory=dict)
    b_tensors: list[str] = field(default_factory=list)
    shape_mismatches: int = 0
    rank_mismatches: int = 0
    variant_pairs: int = 0
    facts: dict[str, Any] = field(default_factory=dict)


def check_tensors(
    tensors: Iterable[TensorInfo],
    *,
    base: BaseModelFacts,
    config: AdapterConfig | None,
    out: ProblemCollector,
) -> TensorCheckResult:
    """Map every tensor to a base-model module and check dtype, pairing and shapes.

    Args:
        tensors: Entries of a checked safetensors header.
        base: The registered base model.
        config: The parsed config, or ``None`` if it was unusable (then
            targeting and rank consistency are not checked).
        out: Receives the problems: ``tensor_dtype_not_allowed``,
            ``tensor_unmapped``, ``tensor_fused_module``,
            ``tensor_layer_out_of_range``, ``tensor_name_variant`` (a pair that fits
            the base but is spelled so the engine would reject or ignore it),
            ``tensor_not_targeted``, ``tensor_full_weight``,
            ``tensor_lora_bias``, ``tensor_dora_magnitude``,
            ``tensor_unpaired``, ``tensor_rank_mismatch``,
            ``tensor_shape_mismatch``.

    Returns:
        Pairs and facts for the later checks.
    """
    result = TensorCheckResult()
    halves: dict[str, dict[str, tuple[TensorInfo, TensorName]]] = {}
    dtypes: set[str] = set()
    tensors = list(tensors)
    for t in tensors:
        dtypes.add(t.dtype)
        if t.dtype not in ALLOWED_DTYPES:
            out.add(
                error(
                    "tensor_dtype_not_allowed",
                    t.name,
                    f"Tensor {t.name} has dtype {t.dtype}; allowed: F16, BF16, F32.",
                    "Save the adapter in float16, bfloat16 or float32 (quantised adapter weights are not served).",
                )
            )
        n = parse_tensor_name(t.name)
        if not _mapped(n, t, base, config, out):
            continue
        assert n.module_path is not None
        slot = halves.setdefault(n.module_path, {})
        if n.kind in slot:
            out.add(
                error(
                    "tensor_duplicate",
                    t.name,
                    f"Tensors {slot[n.kind][0].name} and {t.name} both give {n.kind} of {n.module_path}.",
                    "Keep one spelling of each tensor name.",
                )
            )
            continue
        slot[n.kind] = (t, n)

    ranks: dict[str, set[int]] = {}
    for path, slot in sorted(halves.items()):
        if set(slot) != {"lora_A", "lora_B"}:
            ((t, _),) = slot.values()
            missing = "lora_B" if "lora_A" in slot else "lora_A"
            out.add(
                error(
                    "tensor_unpaired",
                    t.name,
                    f"{t.name} has no matching {missing} tensor for {path}.",
                    "Upload the complete adapter file as written by PEFT `save_pretrained`.",
                )
            )
            continue
        (a, na), (b, _) = slot["lora_A"], slot["lora_B"]
        outcome = _pair_check(path, a, b, na, base, config, out)
        if outcome == "ok":
            variants = [(t, tn) for t, tn in (slot["lora_A"], slot["lora_B"]) if tn.variant is not None]
            if variants:
                # Shapes fit, so this is the base's module under another spelling, not another model.
                result.variant_pairs += 1
                for t, tn in variants:
                    out.add(_variant_problem(t, tn))
                continue
            result.pairs[path] = {"lora_A": a, "lora_B": b}
            result.b_tensors.append(a.name if na.embedding else b.name)
            ranks.setdefault(na.module or path, set()).add(a.shape[0])
        elif outcome == "rank":
            result.rank_mismatches += 1
        else:
            result.shape_mismatches += 1
    result.facts = {
        "tensor_count": len(tensors),
        "lora_pairs": len(result.pairs),
        "lora_modules": sorted({p.rsplit(".", 1)[-1] for p in result.pairs}),
        "layers_with_lora": len({p.split(".")[2] for p in result.pairs if p.startswith("model.layers.")}),
        "effective_ranks": {m: sorted(r) for m, r in sorted(ranks.items())},
        "dtypes": sorted(dtypes),
    }
    return result


def _mapped(
    n: TensorName, t: TensorInfo, base: BaseModelFacts, config: AdapterConfig | None, out: ProblemCollector
) -> bool:
    """Report why a tensor does not map to a LoRA half of a base module; True if it does."""
    mods = ", ".join(base.modules)
    retrain = _RETRAIN.format(base=base.base_model_name, mods=mods)
    if n.kind == "unknown":
        out.add(
            error(
                "tensor_unmapped",
                t.name,
                f"Tensor {t.name} is not a LoRA weight (no lora_A/lora_B in its name).",
                retrain,
            )
        )
        return False
    if n.kind == "lora_bias":
        out.add(
            error(
                "tensor_lora_bias",
                t.name,
                f"Tensor {t.name} is a LoRA bias; the engine does not apply LoRA biases.",
                'Train with lora_bias=false and bias="none".',
            )
        )
        return False
    if n.kind == "dora_magnitude":
        out.add(
            error(
                "tensor_dora_magnitude",
                t.name,
                f"Tensor {t.name} is a DoRA magnitude vector; the engine does not support DoRA.",
                "Train a plain LoRA adapter (use_dora=false).",
            )
        )
        return False
    if n.kind == "full":
        out.add(_full_weight(n, t, base))
        return False
    if n.module_path is None:
        out.add(
            error(
                "tensor_unmapped",
                t.name,
                f"Tensor {t.name} targets {n.module!r}, which is not a module of {base.base_model_name}.",
                retrain,
            )
        )
        return False
    if n.layer is not None:
        if n.module not in base.modules:
            if n.module in FUSED_NAMES:
                out.add(
                    error(
                        "tensor_fused_module",
                        t.name,
                        f"Tensor {t.name} targets the fused projection {n.module!r}, but {base.base_model_name} has separate "
                        f"projections ({mods}); the adapter was trained on another architecture.",
                        retrain,
                    )
                )
            else:
                out.add(
                    error(
                        "tensor_unmapped",
                        t.name,
                        f"Tensor {t.name} targets {n.module!r}, which {base.base_model_name} does not have "
                        f"(its layers have {mods}); the engine would silently ignore it.",
                        retrain,
                    )
                )
            return False
        if n.block != base.blocks.get(n.module or ""):
            out.add(
                error(
                    "tensor_unmapped",
                    t.name,
                    f"Tensor {t.name} puts {n.module} under {n.block!r}; in {base.base_model_name} it is under "
                    f"{base.blocks.get(n.module or '')!r}, so the engine would never find it.",
                    retrain,
                )
            )
            return False
        if n.layer >= base.num_hidden_layers:
            out.add(
                error(
                    "tensor_layer_out_of_range",
                    t.name,
                    f"Tensor {t.name} is for layer {n.layer}, but {base.base_model_name} has {base.num_hidden_layers} layers.",
                    retrain,
                )
            )
            return False
    if config is not None and not config.targets(n.module_path, n.layer):
        out.add(
            error(
                "tensor_not_targeted",
                t.name,
                f"Tensor {t.name} is for {n.module_path}, which target_modules/layers_to_transform/exclude_modules do "
                "not select: PEFT would drop it when loading, while the engine would apply it.",
                "Make target_modules (and layers_to_transform/exclude_modules) match the tensors, or remove the stray tensors.",
            )
        )
        return False
    return True


def _variant_problem(t: TensorInfo, n: TensorName) -> Problem:
    why = (
        "its '.default'-style adapter-name segment makes the engine reject the file"
        if n.variant == "adapter_name"
        else "its module prefix is not the base model's, so the engine would silently ignore it"
    )
    return error(
        "tensor_name_variant",
        t.name,
        f"Tensor {t.name} means {n.canonical}, but {why}.",
        f"Rename it to {n.canonical} (PEFT `save_pretrained` writes that form).",
    )


def _full_weight(n: TensorName, t: TensorInfo, base: BaseModelFacts) -> Problem:
    what = n.module_path or n.module or t.name
    extra = ""
    if n.module in ("embed_tokens", "lm_head") and t.shape:
        rows = t.shape[0]
        if rows != base.vocab_size:
            extra = f" It has {rows} rows; the base vocabulary has {base.vocab_size}" + (
                " (tokens were added during training)." if rows > base.vocab_size else "."
            )
    return error(
        "tensor_full_weight",
        t.name,
        f"Tensor {t.name} is a full weight of {what} (modules_to_save / resized embeddings), not a LoRA pair; "
        f"the engine serves only LoRA deltas on the shared base.{extra}",
        "Train without modules_to_save and without adding tokens, so the adapter holds only lora_A/lora_B tensors.",
    )


def _pair_check(
    path: str,
    a: TensorInfo,
    b: TensorInfo,
    na: TensorName,
    base: BaseModelFacts,
    config: AdapterConfig | None,
    out: ProblemCollector,
) -> str:
    """``"ok"``, ``"rank"`` (fits the base; the rank disagrees) or ``"shape"`` (does not fit the base or is
    malformed); problems go to ``out``."""
    if len(a.shape) != 2 or len(b.shape) != 2:
        out.add(
            error(
                "tensor_shape_mismatch",
                a.name,
                f"LoRA tensors of {path} must be 2-D; got {list(a.shape)} and {list(b.shape)}.",
                "Upload the adapter as written by PEFT `save_pretrained`.",
            )
        )
        return "shape"
    if na.embedding:
        want_in, want_out = base.vocab_size, base.hidden_size
    elif path == "lm_head":
        want_in, want_out = base.hidden_size, base.vocab_size
    elif path == "model.embed_tokens":
        out.add(
            error(
                "tensor_unmapped",
                a.name,
                f"{a.name}: embed_tokens LoRA must use lora_embedding_A/B, not lora_A/B.",
                "Save the adapter with PEFT `save_pretrained`.",
            )
        )
        return "shape"
    else:
        shape = base.modules[na.module or ""]
        want_in, want_out = shape.in_features, shape.out_features
    rank = a.shape[0]
    # In/out features decide the base model; a rank disagreement alone is the adapter's own inconsistency.
    fits_base = a.shape[1] == want_in and b.shape[0] == want_out
    if b.shape[1] != rank:
        out.add(
            error(
                "tensor_rank_mismatch",
                b.name,
                f"{a.name} has rank {rank} but {b.name} has rank {b.shape[1]}.",
                "Upload the adapter as written by PEFT `save_pretrained`; the two halves come from different adapters.",
            )
        )
        return "rank" if fits_base else "shape"
    if config is not None:
        want_rank, _ = config.rank_and_alpha(path)
        if rank != want_rank:
            out.add(
                error(
                    "tensor_rank_mismatch",
                    a.name,
                    f"{path} has rank {rank} in the tensors but the config gives {want_rank} (r / rank_pattern).",
                    "Upload the adapter_config.json that was saved with these weights; the engine scales by the config's rank.",
                )
            )
            return "rank" if fits_base else "shape"
    if a.shape[1] != want_in or b.shape[0] != want_out:
        a_want, b_want = [rank, want_in], [want_out, rank]
        module = a.name.removeprefix("base_model.model.").rsplit(".lora_", 1)[0]
        out.add(
            error(
                "tensor_shape_mismatch",
                a.name,
                f"{module}: lora_A is {list(a.shape)} and lora_B {list(b.shape)}, but {base.base_model_name} needs "
                f"{a_want} and {b_want}: the adapter was trained for a different base model.",
                f"Train the adapter on {base.base_model_name}, or register the base model it was trained on.",
            )
        )
        return "shape"
    return "ok"
