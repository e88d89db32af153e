"""``adapter_config.json``: what the file is (a PEFT LoRA config, its schema, its task type).

Field semantics follow PEFT ``src/peft/config.py`` (``PeftConfigMixin``: ``peft_type``, ``task_type``).
"""

from __future__ import annotations

from typing import Any

from adapters_app.validation.problems import Problem, config_error

#: PEFT ``TaskType`` values; only causal LM adapters are served.
KNOWN_TASK_TYPES = frozenset(
    {"CAUSAL_LM", "SEQ_CLS", "SEQ_2_SEQ_LM", "TOKEN_CLS", "QUESTION_ANS", "FEATURE_EXTRACTION"}
)
_LEGACY_KEYS = frozenset({"enable_lora", "merge_weights"})  # PEFT < 0.3 (MergedLinear era)


def schema_of(doc: dict[str, Any]) -> str:
    """``"peft-legacy"`` for a config with pre-0.3 keys, else ``"peft"``."""
    return "peft-legacy" if _LEGACY_KEYS & set(doc) else "peft"


def peft_type_problem(peft_type: Any) -> Problem | None:
    """The error for a ``peft_type`` other than ``"LORA"``, or None."""
    if peft_type == "LORA":
        return None
    return config_error(
        "config_peft_type_unsupported",
        "peft_type",
        f"peft_type is {str(peft_type)[:40]!r}; only LoRA adapters are served.",
        "Train a LoRA adapter (PEFT `LoraConfig`); vLLM serves no other PEFT method "
        "(vllm/lora/peft_helper.py).",
    )


def not_peft_problem(doc: dict[str, Any]) -> Problem:
    """The error for a config without ``peft_type``, naming the format it looks like (MLX-LM, JAX, other)."""
    keys = set(doc)
    if keys & {"lora_parameters", "fine_tune_type"}:
        origin = "an MLX-LM LoRA config (lora_parameters / fine_tune_type)"
        hint = (
            "MLX adapters (adapters.safetensors) use other tensor names and no PEFT config; fuse with `mlx_lm.fuse` "
            "or convert to a PEFT LoRA adapter, then upload PEFT's adapter_config.json and adapter_model.safetensors."
        )
    elif "lora_rank" in keys or "jax" in str(doc.get("framework", "")).lower():
        origin = "a JAX LoRA config (lora_rank, einsum module names)"
        hint = (
            "Export the adapter to PEFT format (LoraConfig with r, lora_alpha, target_modules and tensors named "
            "base_model.model.model.layers.N.*.lora_A.weight) before uploading."
        )
    else:
        # No known format to name: "it looks like not a PEFT adapter config" read as broken English to users.
        origin = None
        hint = 'Upload the adapter_config.json written by PEFT `save_pretrained`; it has peft_type "LORA".'
    verdict = f"it looks like {origin}" if origin else "it is not a PEFT adapter config"
    return config_error(
        "config_not_peft",
        "peft_type",
        f"adapter_config.json has no peft_type: {verdict}.",
        hint,
    )


def task_type_problems(task: Any, facts: dict[str, Any]) -> list[Problem]:
    """Check ``task_type`` (absent or ``CAUSAL_LM`` pass) and record it in ``facts``."""
    facts["task_type"] = task
    if task is None or task == "CAUSAL_LM":
        return []
    if task in KNOWN_TASK_TYPES:
        return [
            config_error(
                "config_task_type_unsupported",
                "task_type",
                f"task_type is {task}; Quiver serves text generation with causal language models (CAUSAL_LM).",
                'Train the adapter with task_type="CAUSAL_LM" on the registered base model; classification, '
                "seq2seq and feature-extraction adapters cannot be served by the generation engine.",
            )
        ]
    return [
        config_error(
            "config_task_type_unknown",
            "task_type",
            f"task_type {str(task)[:40]!r} is not a PEFT task type.",
            'Set task_type to "CAUSAL_LM" (or remove it).',
        )
    ]
