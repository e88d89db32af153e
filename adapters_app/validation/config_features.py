"""``adapter_config.json``: the PEFT features the engine refuses or would silently ignore (DoRA, biases,
``modules_to_save``, trained tokens, base-modifying inits, …), and ``fan_in_fan_out``.

Each follows vLLM 0.32's ``vllm/lora/peft_helper.py`` (``_validate_features``, ``validate_legal``,
``_init_is_supported``): every unsupported feature is an error naming the engine limit; nothing is silently dropped.
"""

from __future__ import annotations

from typing import Any

from adapters_app.validation.problems import Problem, config_error, warning

#: ``init_lora_weights`` strings that only set initial weights (vllm ``PEFTHelper._init_is_supported``).
_PLAIN_INITS = frozenset({"gaussian", "eva", "orthogonal", "mica", "lora_ga"})


def fan_in_fan_out_warning() -> Problem:
    """The warning for ``fan_in_fan_out: true``, which PEFT ignores for ``nn.Linear`` projections."""
    return warning(
        "config_fan_in_fan_out_ignored",
        "fan_in_fan_out",
        "fan_in_fan_out is true, but the base model's projections are nn.Linear, for which PEFT ignores it "
        "(it applies to GPT-2 style Conv1D layers).",
        "Nothing to do if the tensors have the nn.Linear layout; set it to false to silence this warning.",
    )


def unsupported_features(doc: dict[str, Any]) -> list[Problem]:
    """Features vLLM refuses or would silently ignore (vllm/lora/peft_helper.py)."""
    out: list[Problem] = []

    def refuse(code: str, key: str, what: str, hint: str) -> None:
        out.append(config_error(code, key, what, hint))

    if doc.get("use_dora"):
        refuse(
            "config_dora_unsupported",
            "use_dora",
            "use_dora is true: DoRA adapters are not supported by the engine (vLLM refuses DoRA).",
            "Train a plain LoRA adapter (use_dora=false), or merge the DoRA adapter into a full model.",
        )
    bias = doc.get("bias", "none")
    if bias not in (None, "none"):
        refuse(
            "config_bias_unsupported",
            "bias",
            f"bias is {str(bias)[:20]!r}: trained biases are not supported by the engine (vLLM: 'Adapter bias is not supported').",
            'Train with bias="none".',
        )
    if doc.get("lora_bias"):
        refuse(
            "config_bias_unsupported",
            "lora_bias",
            "lora_bias is true: LoRA-B biases are not supported by the engine.",
            "Train with lora_bias=false.",
        )
    mts = doc.get("modules_to_save")
    if mts:
        names = ", ".join(str(m) for m in mts) if isinstance(mts, list) else str(mts)
        refuse(
            "config_modules_to_save_unsupported",
            "modules_to_save",
            f"modules_to_save lists {names[:120]}: full copies of modules are not served by the engine (vLLM accepts "
            "them only for classification heads of pooling models).",
            "Train without modules_to_save (for new tokens, use a base model that already has them).",
        )
    if doc.get("trainable_token_indices"):
        refuse(
            "config_trainable_tokens_unsupported",
            "trainable_token_indices",
            "trainable_token_indices is set: trained token embeddings are not applied by the engine, which would "
            "serve the base embeddings instead.",
            "Train without trainable_token_indices.",
        )
    init = doc.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in _PLAIN_INITS:
        refuse(
            "config_init_unsupported",
            "init_lora_weights",
            f"init_lora_weights is {init[:40]!r}: this init (PiSSA, OLoRA, CorDA, LoftQ) modifies the base model "
            "weights, which the shared base model does not have.",
            "Convert it to a plain LoRA adapter with PEFT's path_initial_model_for_weight_conversion.",
        )
    for key, what in (
        ("alora_invocation_tokens", "Activated LoRA (aLoRA)"),
        ("layer_replication", "layer_replication"),
        ("use_bdlora", "block-diagonal LoRA (BD-LoRA)"),
        ("use_qalora", "QALoRA"),
        ("target_parameters", "LoRA on raw parameters (target_parameters)"),
    ):
        if doc.get(key):
            refuse(
                "config_feature_unsupported",
                key,
                f"{key} is set: {what} is not supported by the engine.",
                f"Train without {key}.",
            )
    enable = doc.get("enable_lora")
    if enable is not None and not (isinstance(enable, list) and all(enable)):
        refuse(
            "config_feature_unsupported",
            "enable_lora",
            "enable_lora (PEFT < 0.3 MergedLinear) applies LoRA to only part of a fused projection, which the engine "
            "cannot represent.",
            "Re-train or convert with a current PEFT version.",
        )
    return out
