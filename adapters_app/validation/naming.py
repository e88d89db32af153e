"""Mapping adapter tensor names to modules of a Llama-style base model.

The engine-native form (what vLLM's ``parse_fine_tuned_lora_name`` in
``vllm/lora/utils.py`` turns into the module path it looks up) is::

    base_model.model.model.layers.{i}.{self_attn|mlp}.{name}.lora_{A|B}.weight
    base_model.model.model.embed_tokens.lora_embedding_{A|B}
    base_model.model.lm_head.lora_{A|B}.weight

(``base_model.model.`` may be absent.) Variants are recognised so they can be
named precisely, but they are not engine-native: a ``.default`` adapter-name
segment makes vLLM raise "unsupported LoRA weight", and a wrapper prefix
(``language_model.``) or a missing ``model.`` gives a module path vLLM never
looks up, so the tensor would be silently ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PEFT_PREFIX = "base_model.model."
_LORA = re.compile(r"^(?P<mod>.+)\.lora_(?P<ab>[AB])(?:\.(?P<adapter>[^.]+))?\.weight$")
_LORA_EMB = re.compile(r"^(?P<mod>.+)\.lora_embedding_(?P<ab>[AB])(?:\.(?P<adapter>[^.]+))?$")
_LORA_BIAS = re.compile(r"^(?P<mod>.+)\.lora_[AB](?:\.[^.]+)?\.bias$")
_DORA = re.compile(r"^(?P<mod>.+)\.lora_magnitude_vector(?:\.[^.]+)?(?:\.weight)?$")
_LAYER = re.compile(r"^(?P<wrap>(?:.+\.)?)layers\.(?P<layer>\d+)\.(?P<block>[^.]+)\.(?P<name>[^.]+)$")
_TOP = re.compile(r"^(?P<wrap>(?:.+\.)?)(?P<name>embed_tokens|lm_head)$")


@dataclass(frozen=True)
class TensorName:
    """What one tensor name refers to.

    Attributes:
        raw: The name in the file.
        kind: ``"lora_A"``, ``"lora_B"`` (also for embedding LoRA), ``"lora_bias"``,
            ``"dora_magnitude"``, ``"full"`` (a full weight, e.g. a
            ``modules_to_save`` copy) or ``"unknown"``.
        module_path: Canonical PEFT module path, e.g.
            ``"model.layers.0.self_attn.q_proj"``, ``"model.embed_tokens"``,
            ``"lm_head"``; ``None`` if the name does not locate a module.
        module: Leaf module name, e.g. ``"q_proj"``.
        block: Decoder block from the name (``"self_attn"``, ``"mlp"``), if any.
        layer: Decoder layer index, if any.
        variant: ``None`` for engine-native names, else ``"adapter_name"``
            (``.default`` segment) or ``"wrapper_prefix"``.
        canonical: The engine-native spelling (for rename hints), if known.
        embedding: True for ``lora_embedding_A/B``.
    """

    raw: str
    kind: str
    module_path: str | None = None
    module: str | None = None
    block: str | None = None
    layer: int | None = None
    variant: str | None = None
    canonical: str | None = None
    embedding: bool = False


def parse_tensor_name(raw: str) -> TensorName:
    """Classify one tensor name of an adapter file.

    Args:
        raw: E.g. ``"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"``.

    Returns:
        The classification; never raises.
    """
    s = raw[len(_PEFT_PREFIX) :] if raw.startswith(_PEFT_PREFIX) else raw
    for pattern, kind in ((_LORA_BIAS, "lora_bias"), (_DORA, "dora_magnitude")):
        m = pattern.match(s)
        if m:
            return _locate(raw, kind, m["mod"], None, embedding=False)
    m = _LORA.match(s) or _LORA_EMB.match(s)
    if m:
        embedding = m.re is _LORA_EMB
        return _locate(raw, f"lora_{m['ab']}", m["mod"], m["adapter"], embedding=embedding)
    if s.endswith((".weight", ".bias")):
        mod = s.rsplit(".", 1)[0]
        for wrapper in (".modules_to_save.default", ".original_module", ".base_layer"):
            mod = mod.replace(wrapper, "")
        return _locate(raw, "full", mod, None, embedding=False)
    return TensorName(raw=raw, kind="unknown")


def _locate(raw: str, kind: str, mod: str, adapter: str | None, *, embedding: bool) -> TensorName:
    variant = "adapter_name" if adapter is not None else None
    m = _LAYER.match(mod)
    if m:
        path = f"model.layers.{m['layer']}.{m['block']}.{m['name']}"
        if m["wrap"] != "model.":
            variant = variant or "wrapper_prefix"
        return TensorName(
            raw=raw,
            kind=kind,
            module_path=path,
            module=m["name"],
            block=m["block"],
            layer=int(m["layer"]),
            variant=variant,
            canonical=_canonical(path, kind, embedding),
            embedding=embedding,
        )
    m = _TOP.match(mod)
    if m:
        path = "lm_head" if m["name"] == "lm_head" else "model.embed_tokens"
        expected_wrap = "" if path == "lm_head" else "model."
        if m["wrap"] != expected_wrap:
            variant = variant or "wrapper_prefix"
        return TensorName(
            raw=raw,
            kind=kind,
            module_path=path,
            module=m["name"],
            variant=variant,
            canonical=_canonical(path, kind, embedding),
            embedding=embedding,
        )
    return TensorName(raw=raw, kind=kind, module=mod.rsplit(".", 1)[-1], variant=variant)


def _canonical(path: str, kind: str, embedding: bool) -> str | None:
    if kind not in ("lora_A", "lora_B"):
        return None
    if embedding:
        return f"{_PEFT_PREFIX}{path}.lora_embedding_{kind[-1]}"
    return f"{_PEFT_PREFIX}{path}.{kind}.weight"
