"""Facts about a registered base model and a node pool's engine limits.

The validator decides "does this adapter fit the base" from these facts only
(tensor shapes), never from the adapter's ``base_model_name_or_path`` string.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Hugging Face ``architectures`` whose decoder layers are Llama-shaped:
#: ``self_attn.{q,k,v,o}_proj`` and ``mlp.{gate,up,down}_proj`` as separate
#: ``nn.Linear`` layers (transformers ``modeling_llama.py``, ``modeling_mistral.py``,
#: ``modeling_qwen2.py``, ``modeling_qwen3.py``).
LLAMA_STYLE_ARCHITECTURES = frozenset(
    {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}
)

_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

#: Module name -> the decoder-layer block that holds it, for Llama-style models.
LLAMA_BLOCKS: Mapping[str, str] = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


@dataclass(frozen=True)
class ModuleShape:
    """Shape of one per-layer linear module, as ``nn.Linear(in_features, out_features)``.

    A LoRA pair on it has ``lora_A`` of shape ``[r, in_features]`` and
    ``lora_B`` of shape ``[out_features, r]``.
    """

    in_features: int
    out_features: int


@dataclass(frozen=True)
class BaseModelFacts:
    """What the validator needs to know about a registered base model.

    Attributes:
        base_model_name: The name the engine serves it under (vLLM ``--model``).
        architecture: Hugging Face architecture, e.g. ``"LlamaForCausalLM"``.
        hidden_size: Model width ``d``.
        num_hidden_layers: Number of decoder layers.
        vocab_size: Rows of ``embed_tokens`` / ``lm_head``.
        modules: Per-layer linear module name (``"q_proj"``, ``"down_proj"``, …)
            to its shape.
        blocks: Per-layer module name to the block holding it (``"self_attn"``
            or ``"mlp"``); module paths are ``model.layers.{i}.{block}.{name}``.
    """

    base_model_name: str
    architecture: str
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    modules: Mapping[str, ModuleShape]
    blocks: Mapping[str, str] = field(default_factory=lambda: dict(LLAMA_BLOCKS))

    @classmethod
    def from_hf_config(cls, base_model_name: str, config: Mapping[str, Any]) -> BaseModelFacts:
        """Derive the facts from a Hugging Face ``config.json`` of a Llama-style model.

        Shapes follow transformers ``LlamaAttention``/``LlamaMLP``: ``head_dim``
        defaults to ``hidden_size // num_attention_heads`` and
        ``num_key_value_heads`` to ``num_attention_heads``.

        Args:
            base_model_name: The served model name.
            config: The parsed ``config.json``.

        Returns:
            The facts, with modules q/k/v/o/gate/up/down.

        Raises:
            ValueError: Naming the field, if ``architectures`` is not one of
                :data:`LLAMA_STYLE_ARCHITECTURES` or a size field is missing or
                not a positive integer.
        """
        archs = config.get("architectures")
        if not archs and config.get("model_type") in _MODEL_TYPES:
            # An in-memory transformers config has no `architectures` until save_pretrained fills it.
            archs = [_MODEL_TYPES[config["model_type"]]]
        if not isinstance(archs, list) or not archs or archs[0] not in LLAMA_STYLE_ARCHITECTURES:
            raise ValueError(
                f"config field 'architectures' is {archs!r}; supported: {sorted(LLAMA_STYLE_ARCHITECTURES)} "
                "(Llama-style models with separate q/k/v/o and gate/up/down projections)"
            )

        def positive(key: str, default: int | None = None) -> int:
            value = config.get(key, default)
            if value is None and default is not None:
                value = default
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"config field {key!r} must be a positive integer, got {value!r}")
            return value

        hidden = positive("hidden_size")
        heads = positive("num_attention_heads")
        kv_heads = positive("num_key_value_heads", heads)
        if hidden % heads and config.get("head_dim") is None:
            raise ValueError(
                "config field 'head_dim' is required when hidden_size is not divisible by num_attention_heads"
            )
        head_dim = positive("head_dim", hidden // heads)
        inter = positive("intermediate_size")
        q_out, kv_out = heads * head_dim, kv_heads * head_dim
        modules = {
            "q_proj": ModuleShape(hidden, q_out),
            "k_proj": ModuleShape(hidden, kv_out),
            "v_proj": ModuleShape(hidden, kv_out),
            "o_proj": ModuleShape(q_out, hidden),
            "gate_proj": ModuleShape(hidden, inter),
            "up_proj": ModuleShape(hidden, inter),
            "down_proj": ModuleShape(inter, hidden),
        }
        return cls(
            base_model_name=base_model_name,
            architecture=archs[0],
            hidden_size=hidden,
            num_hidden_layers=positive("num_hidden_layers"),
            vocab_size=positive("vocab_size"),
            modules=modules,
        )

    def module_paths(self) -> list[str]:
        """Every LoRA-able module path of the model, as PEFT names them.

        Returns:
            ``model.layers.{i}.{block}.{name}`` for each layer and module, then
            ``model.embed_tokens`` and ``lm_head``.
        """
        paths = [
            f"model.layers.{i}.{self.blocks[name]}.{name}"
            for i in range(self.num_hidden_layers)
            for name in self.modules
        ]
        return [*paths, "model.embed_tokens", "lm_head"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, stored in the database; inverse of :meth:`from_dict`."""
        return {
            "base_model_name": self.base_model_name,
            "architecture": self.architecture,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "vocab_size": self.vocab_size,
            "modules": {
                k: {"in_features": v.in_features, "out_features": v.out_features}
                for k, v in self.modules.items()
            },
            "blocks": dict(self.blocks),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BaseModelFacts:
        """Rebuild facts stored with :meth:`to_dict`.

        Raises:
            ValueError: Naming the missing or malformed key.
        """
        try:
            modules = {
                k: ModuleShape(int(v["in_features"]), int(v["out_features"])) for k, v in d["modules"].items()
            }
            blocks = dict(d.get("blocks") or {k: LLAMA_BLOCKS.get(k, "") for k in modules})
            return cls(
                base_model_name=str(d["base_model_name"]),
                architecture=str(d["architecture"]),
                hidden_size=int(d["hidden_size"]),
                num_hidden_layers=int(d["num_hidden_layers"]),
                vocab_size=int(d["vocab_size"]),
                modules=modules,
                blocks=blocks,
            )
        except KeyError as exc:
            raise ValueError(f"BaseModelFacts dict is missing key {exc.args[0]!r}") from exc
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"BaseModelFacts dict is malformed: {exc}") from exc


@dataclass(frozen=True)
class PoolLimits:
    """Engine limits of the node pool an adapter must fit.

    Attributes:
        max_lora_rank: vLLM ``--max-lora-rank``; an adapter's largest rank
            (``r`` and every ``rank_pattern`` value) must not exceed it
            (vllm ``vllm/lora/peft_helper.py`` ``validate_legal``).
        max_adapter_bytes: Per-adapter byte budget of the pool (size of
            ``adapter_model.safetensors``).
        allow_embedding_lora: Whether the pool serves LoRA on ``embed_tokens``
            / ``lm_head``. vLLM's Llama declares them as ``embedding_modules``,
            but Quiver's end-to-end parity tests cover only the linear
            projections, so pools refuse them unless an operator opts in.
    """

    max_lora_rank: int
    max_adapter_bytes: int
    allow_embedding_lora: bool = False
