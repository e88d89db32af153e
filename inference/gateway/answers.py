"""What the engine answers, in OpenAI's terms: vLLM-only fields stripped, nulls OpenAI never sends dropped, and the
engine's errors (its own dialect, its context-length messages, a refused node key) turned into OpenAI-shaped ones."""

from __future__ import annotations

import logging
import re
from typing import Any

from inference.gateway.errors import GatewayError
from inference.gateway.snapshot import TargetView

logger = logging.getLogger(__name__)

# vLLM-only response fields that say nothing to a tenant (or say how the platform is built).
ENGINE_FIELDS = ("kv_transfer_params", "ec_transfer_params", "metrics", "system_fingerprint")


ENGINE_CHOICE_FIELDS = ("routed_experts", "prompt_logprobs", "prompt_token_ids", "token_ids", "stop_reason")


# Optional in OpenAI's schema but never null there; vLLM sends them as null (llm-comply's schema check, openai_chat.json).
NON_NULL_FIELDS = ("service_tier", "prompt_token_ids", "prompt_text")  # the last two: vLLM's, null unless asked
NON_NULL_USAGE_FIELDS = ("prompt_tokens_details", "completion_tokens_details")
NON_NULL_MESSAGE_FIELDS = ("annotations", "function_call", "audio")


def _drop_nulls(obj: Any, names: tuple[str, ...]) -> None:
    if isinstance(obj, dict):
        for name in names:
            if name in obj and obj[name] is None:
                del obj[name]


def strip_engine_fields(data: dict[str, Any]) -> None:
    """Drop, in place, the vLLM-only fields of an answer or chunk (``ENGINE_FIELDS``, per choice
    ``ENGINE_CHOICE_FIELDS``) and the fields OpenAI never sends as null."""
    for name in ENGINE_FIELDS:
        data.pop(name, None)
    _drop_nulls(data, NON_NULL_FIELDS)
    _drop_nulls(data.get("usage"), NON_NULL_USAGE_FIELDS)
    for choice in data.get("choices") or []:
        if isinstance(choice, dict):
            for name in ENGINE_CHOICE_FIELDS:
                if choice.get(name) is None:
                    choice.pop(name, None)
            _drop_nulls(choice.get("message"), NON_NULL_MESSAGE_FIELDS)
            _drop_nulls(choice.get("delta"), NON_NULL_MESSAGE_FIELDS)


# The engine refusing the gateway's credentials (the node's key, its VLLM_API_KEY): the caller's key was fine.
ENGINE_AUTH_STATUSES = (401, 403)


def engine_error(status: int, data: Any, target: TargetView, *, node_name: str | None = None,
                  endpoint: str = "completions") -> GatewayError:
    """An engine error in OpenAI's shape with our own message: no engine internals, no served names.

    A 401/403 from the engine means it refused the gateway's node key (a platform misconfiguration: a rotated
    ``VLLM_API_KEY``, a stale node key), never the caller's key, which the gateway already checked: it is a 502
    ``upstream_auth_failed`` (passing it on made a good key look revoked), logged at error for operators.
    """
    if status in ENGINE_AUTH_STATUSES:
        logger.error("gateway.engine_auth_refused", extra={
            "node": node_name, "status": status, "model": target.served_name,
            "detail": "the engine refused the node key: check the node's key against its engine's VLLM_API_KEY"})
        return GatewayError(502, "The inference node refused the platform's own credentials (a configuration fault "
                            "on our side, not your API key); retry, and contact the operator if it persists.",
                            code="upstream_auth_failed", type_="server_error")
    engine_message, engine_param = "", ""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        engine_message = str(data["error"].get("message") or "")
        engine_param = str(data["error"].get("param") or "")
    try:
        limit = _context_error(engine_message, engine_param, target, endpoint) if status == 400 else None
    except ValueError:  # a figure past int()'s 4,300 digits (sys.get_int_max_str_digits): no engine's, and no 500
        limit = None
    if limit is not None:
        return limit
    context = re.search(r"maximum context length is (\d+)", engine_message)
    if status == 400 and (context or engine_param in ("input_tokens", "input_text")):
        size = f" of {context.group(1)} tokens" if context else ""
        return GatewayError(400, f"The prompt plus the requested completion exceeds the model's context{size}; "
                            "shorten the prompt or lower 'max_tokens'.", code="context_length_exceeded",
                            param="max_tokens")
    if status == 404:
        return GatewayError(404, f"The model `{target.requested}` is not available on the node right now; retry.",
                            code="model_not_available", type_="server_error", param="model")
    if 400 <= status < 500:
        param = None
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            raw_param = data["error"].get("param")
            # Only the top-level field: the rest is the engine's schema (`messages.0.ChatCompletion…Param.role`).
            field = raw_param.removeprefix("body.").split(".")[0] if isinstance(raw_param, str) else ""
            param = field if re.fullmatch(r"[a-z_]{1,40}", field) else None
        message = "The engine refused the request" + (f" (field '{param}')" if param else "") + \
            "; check the request's parameters against the model's limits."
        return GatewayError(400, message, code="invalid_request", param=param)
    return GatewayError(502, "The inference node failed to answer; retry.", code="upstream_error",
                        type_="server_error")


# vLLM's refusals of a request that cannot fit the model's context (vllm/renderers/params.py, TokenizeParams): a
# completion budget above the context itself (checked before the prompt is tokenized, so the prompt's length is not
# known), and a prompt that alone fills it (counted in tokens, or first bounded in characters). A completion that fits
# the context but not next to the prompt is no error there: it is shortened to what is left (get_max_tokens), and the
# choice's finish_reason says "length". Older vLLM refused that case with the prompt's count ("you requested ...").
_OUTPUT_OVER_CONTEXT = re.compile(r"\b(max_tokens|max_completion_tokens)=(\d+) cannot be greater than "
                                  r"max_model_len=(\d+)")
_SUM_OVER_CONTEXT = re.compile(r"maximum context length is (\d+) tokens\. However, you requested \d+ tokens "
                               r"\((\d+) in the messages, (\d+) in the completion\)")
_PROMPT_OVER_CONTEXT = re.compile(r"maximum context length is (\d+) tokens\. However, your prompt contains "
                                  r"(at least )?(\d+) (input tokens|characters)")


def _context_error(engine_message: str, engine_param: str, target: TargetView,
                   endpoint: str) -> GatewayError | None:
    """The caller's own 400 for vLLM's context-length refusals, naming the field and the fix; None for other errors.

    Args:
        engine_message: the engine's ``error.message``.
        engine_param: the engine's ``error.param`` (``max_tokens``, ``max_completion_tokens``, ``input_tokens``,
            ``input_text``).
        target: the request's model (``requested`` names it in the message; served names never appear).
        endpoint: ``completions`` or ``chat/completions`` (``ROUTES``): which field holds the prompt.

    Returns:
        A 400 ``context_length_exceeded`` whose ``param`` is the field to change (``max_tokens`` or
        ``max_completion_tokens``; ``prompt`` or ``messages`` when the prompt alone is too long), or None.
    """
    model = f"model `{target.requested}`"
    if (output := _OUTPUT_OVER_CONTEXT.search(engine_message)) is not None:
        field, asked, context = output.group(1), int(output.group(2)), int(output.group(3))
        return GatewayError(
            400, f"Invalid '{field}': {asked} exceeds the context of {model}, {context} tokens; lower '{field}' to at "
            f"most {context} (a completion that does not fit beside the prompt stops early, finish_reason \"length\").",
            code="context_length_exceeded", param=field)
    if (total := _SUM_OVER_CONTEXT.search(engine_message)) is not None:
        field = engine_param if engine_param in ("max_tokens", "max_completion_tokens") else "max_tokens"
        context, prompt_tokens, asked = (int(g) for g in total.groups())
        room = context - prompt_tokens
        fix = f"lower '{field}' to at most {room}" if room > 0 else "shorten the prompt"
        return GatewayError(
            400, f"Invalid '{field}': {asked} exceeds the context of {model}, {context} tokens, minus the prompt's "
            f"{prompt_tokens}; {fix}.", code="context_length_exceeded", param=field if room > 0 else None)
    prompt = _PROMPT_OVER_CONTEXT.search(engine_message)
    if prompt is not None or engine_param in ("input_tokens", "input_text"):
        field = "messages" if endpoint == "chat/completions" else "prompt"
        if prompt is not None:
            unit = "tokens" if prompt.group(4) == "input tokens" else "characters"
            count = f"{prompt.group(2) or ''}{prompt.group(3)} {unit}"
            size = f"{count}, more than the context of {model}, {prompt.group(1)} tokens, holds"
        else:
            size = f"more than the context of {model} holds"
        return GatewayError(400, f"Invalid '{field}': the prompt is {size}, with no room left for a completion; "
                            f"shorten '{field}'.", code="context_length_exceeded", param=field)
    return None

