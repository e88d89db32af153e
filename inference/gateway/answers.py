"""What the engine answers, in OpenAI's terms: vLLM-only fields stripped, nulls OpenAI never sends dropped, and the
engine's errors (its own dialect, its context-length messages, a refused node key) turned into OpenAI-shaped ones."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
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


# What ``sse_event`` returns for the stream's last line, ``data: [DONE]``.
DONE = "[DONE]"


def sse_event(line: str) -> dict[str, Any] | str | None:
    """One line of the engine's server-sent events: :data:`DONE`, the event's JSON object, or None for anything else
    (blank lines, comments, other fields, a payload that is not a JSON object). The one parser of the relay, the
    JSON assembly and the billing of cut streams."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == DONE:
        return DONE
    try:
        event = json.loads(payload)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def engine_error_code(event: Mapping[str, Any]) -> int | None:
    """The status of an engine's mid-stream error event (vLLM's dialect: ``{"error": {..., "code": 500}}`` and no
    choices), 500 when its code is not an HTTP error status; None when ``event`` is not one."""
    error = event.get("error")
    if not isinstance(error, dict) or event.get("choices"):
        return None
    code = error.get("code")
    return code if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600 else 500


# The engine refusing the gateway's credentials (the node's key, its VLLM_API_KEY): the caller's key was fine.
ENGINE_AUTH_STATUSES = (401, 403)


def engine_error(status: int, data: Any, target: TargetView, *, node_name: str | None = None,
                  endpoint: str = "completions") -> GatewayError:
    """An engine error in OpenAI's shape with our own message: no engine internals, no served names.

    A 401/403 from the engine means it refused the gateway's node key (a platform misconfiguration: a rotated
    ``VLLM_API_KEY``, a stale node key), never the caller's key, which the gateway already checked: it is a 502
    ``upstream_auth_failed`` (passing it on made a good key look revoked), logged at error for operators. An engine
    launched without tool calling refuses ``tools`` naming its own launch flags: that keeps its status and becomes
    ``tools_not_supported`` with ``param`` ``tools`` and the fix the caller can make.
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
    if 400 <= status < 500 and _NO_TOOL_CALLING.search(engine_message):
        # vLLM names its own launch flags here, which the caller can neither see nor set (param null, too).
        return GatewayError(status, f"The model `{target.requested}` is served without tool calling; remove 'tools' "
                            "and 'tool_choice' from the request.", code="tools_not_supported", param="tools")
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
        detail = _engine_detail(engine_message, target)
        message = "The engine refused the request" + (f" (field '{param}')" if param else "") + \
            (f": {detail}" if detail else "; check the request's parameters against the model's limits.")
        return GatewayError(400, message, code="invalid_request", param=param)
    return GatewayError(502, "The inference node failed to answer; retry.", code="upstream_error",
                        type_="server_error")


# vLLM launched without tool parsing (vllm/entrypoints/openai/chat_completion/serving.py): '"auto" tool choice requires
# --enable-auto-tool-choice and --tool-call-parser to be set', and for "required" or a named tool
# 'tool_choice="required" requires --tool-call-parser to be set'.
_NO_TOOL_CALLING = re.compile(r"--enable-auto-tool-choice|--tool-call-parser")

# What may not appear in an engine message passed on: adapters' and nodes' names, paths, code, multi-line text.
_INTERNAL = re.compile(r"lora|adapter|node|quiver|[/\\\n`{}]|traceback|file ", re.IGNORECASE)


def _engine_detail(engine_message: str, target: TargetView) -> str:
    """vLLM's own reason for a refused request (its ``VLLMValidationError`` text, such as ``n must be 1 when using
    greedy sampling, got 2.``) when it says nothing of how the platform is built, else ``""``: no served or base
    model name, nothing naming adapters or nodes, no paths or code, at most 300 characters."""
    text = engine_message.strip()
    if not text or len(text) > 300 or _INTERNAL.search(text):
        return ""
    if target.served_name and target.served_name in text:
        return ""
    if target.base_model_name and target.base_model_name in text:
        return ""
    return text


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



class UsageTally:
    """The tokens one request cost, from the engine's own per-chunk counts, however the request ends.

    vLLM's ``continuous_usage_stats`` puts on each streamed chunk the prompt tokens of that chunk's prompt and the
    completion tokens of that chunk's choice so far (``vllm/entrypoints/openai/completion/serving.py`` and
    ``chat_completion/serving.py``: ``previous_num_tokens[i]``, ``num_prompt_tokens[prompt_idx]``); choice ``i``
    belongs to prompt ``i // n``. The final usage chunk, when the stream ends, carries the engine's totals. A request
    cut before its end is billed the sum over choices and prompts of the last counts seen; a prompt none of whose
    chunks arrived is billed its count from ``prompt_tokens`` (the gateway's own count of it).

    Args:
        n: choices per prompt (the body's ``n``, default 1).
        prompt_tokens: each prompt's token count as the gateway counted it, in order (may be empty).
    """

    def __init__(self, *, n: int = 1, prompt_tokens: Sequence[int] = ()) -> None:
        self.n = max(1, n)
        self.counted = list(prompt_tokens)
        self.prompts: dict[int, int] = {}
        self.choices: dict[int, int] = {}
        self.final: dict[str, Any] | None = None

    def add(self, chunk: Mapping[str, Any]) -> None:
        """Take one parsed chunk's ``usage`` (ignored when absent or malformed)."""
        usage = chunk.get("usage")
        if not isinstance(usage, dict):
            return
        choices = chunk.get("choices")
        if not choices:
            self.final = usage
            return
        prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
        for choice in choices:
            index = choice.get("index") if isinstance(choice, dict) else None
            if isinstance(index, int) and not isinstance(index, bool) and 0 <= index:
                self.choices[index] = max(self.choices.get(index, 0), completion)
                self.prompts[index // self.n] = prompt

    def usage(self) -> dict[str, int] | None:
        """``{"prompt_tokens", "completion_tokens", "total_tokens"}``: the engine's totals when its stream ended,
        else the sum of what was seen (and counted prompts not seen); None when nothing is known at all."""
        if self.final is not None:
            prompt, completion = _count(self.final.get("prompt_tokens")), _count(self.final.get("completion_tokens"))
        else:
            if not self.choices and not self.counted:
                return None
            prompts = dict(enumerate(self.counted))
            prompts.update(self.prompts)  # the engine's count wins over ours
            prompt, completion = sum(prompts.values()), sum(self.choices.values())
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _extend(into: dict[str, Any], part: Mapping[str, Any]) -> None:
    """Append each list of ``part`` (a chunk's logprobs) to the same key of ``into``."""
    for name, value in part.items():
        if isinstance(value, list):
            into.setdefault(name, []).extend(value)
        elif name not in into:
            into[name] = value


def assemble_answer(endpoint: str, chunks: Sequence[Mapping[str, Any]], usage: dict[str, int] | None) -> dict[str, Any]:
    """The non-streamed answer OpenAI's API gives, built from the engine's streamed chunks.

    The gateway always streams from the engine, so that a client who leaves before the end is billed what the
    engine generated up to then (``UsageTally``); a client who asked for one JSON answer gets it from here. Per
    choice index: the text (chat: ``message.content``, reasoning, ``tool_calls`` joined by their index), logprobs
    concatenated, the last ``finish_reason`` and ``stop_reason``, and vLLM's ``return_token_ids`` fields when asked
    (``token_ids`` concatenated, ``prompt_token_ids`` from the first chunk that has them: per choice for completions,
    on the answer for chat, as vLLM's unstreamed answers carry them).

    Args:
        endpoint: ``"completions"`` or ``"chat/completions"``.
        chunks: the parsed ``data:`` payloads, in order (usage-only chunks included or not).
        usage: the request's usage (``UsageTally.usage``).

    Returns:
        ``{"id", "object", "created", "model", "choices", "usage"}`` in OpenAI's shape.
    """
    chat = endpoint == "chat/completions"
    first = next((c for c in chunks if c.get("choices")), chunks[0] if chunks else {})
    merged: dict[int, dict[str, Any]] = {}
    answer_prompt_ids: list[Any] | None = None
    for chunk in chunks:
        if answer_prompt_ids is None and isinstance(chunk.get("prompt_token_ids"), list):
            answer_prompt_ids = chunk["prompt_token_ids"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or not isinstance(choice.get("index"), int):
                continue
            into = merged.setdefault(choice["index"], {"text": [], "logprobs": None, "finish_reason": None,
                                                       "stop_reason": None, "role": None, "content": None,
                                                       "reasoning": {}, "tool_calls": {},
                                                       "token_ids": None, "prompt_token_ids": None})
            if isinstance(choice.get("token_ids"), list):
                into["token_ids"] = (into["token_ids"] or []) + choice["token_ids"]
            if into["prompt_token_ids"] is None and isinstance(choice.get("prompt_token_ids"), list):
                into["prompt_token_ids"] = choice["prompt_token_ids"]
            if choice.get("finish_reason") is not None:
                into["finish_reason"] = choice["finish_reason"]
            if choice.get("stop_reason") is not None:
                into["stop_reason"] = choice["stop_reason"]
            if isinstance(choice.get("logprobs"), dict):
                into["logprobs"] = into["logprobs"] or {}
                _extend(into["logprobs"], choice["logprobs"])
            if not chat:
                into["text"].append(str(choice.get("text") or ""))
                continue
            delta: dict[str, Any] = choice["delta"] if isinstance(choice.get("delta"), dict) else {}
            into["role"] = delta.get("role") or into["role"]
            if isinstance(delta.get("content"), str):
                into["content"] = (into["content"] or "") + delta["content"]
            for name in ("reasoning", "reasoning_content"):
                if isinstance(delta.get(name), str):
                    into["reasoning"][name] = into["reasoning"].get(name, "") + delta[name]
            for call in delta.get("tool_calls") or []:
                if isinstance(call, dict):
                    _tool_call_add(into["tool_calls"], call)
    choices = []
    for index in sorted(merged):
        into = merged[index]
        out: dict[str, Any] = {"index": index}
        if chat:
            message: dict[str, Any] = {"role": into["role"] or "assistant", "content": into["content"], "refusal": None}
            message.update(into["reasoning"])
            if into["tool_calls"]:
                message["tool_calls"] = [into["tool_calls"][k] for k in sorted(into["tool_calls"])]
            out["message"] = message
        else:
            out["text"] = "".join(into["text"])
        out.update(logprobs=into["logprobs"], finish_reason=into["finish_reason"], stop_reason=into["stop_reason"])
        for name in ("prompt_token_ids", "token_ids"):
            if into[name] is not None:
                out[name] = into[name]
        choices.append(out)
    answer: dict[str, Any] = {
        "id": first.get("id", ""), "object": "chat.completion" if chat else "text_completion",
        "created": first.get("created", 0), "model": first.get("model", ""), "choices": choices,
        "usage": usage or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
    if answer_prompt_ids is not None:
        answer["prompt_token_ids"] = answer_prompt_ids
    return answer


def _tool_call_add(calls: dict[int, dict[str, Any]], delta: Mapping[str, Any]) -> None:
    """Join one streamed tool-call delta into ``calls`` by its ``index``: id, type and name from the first delta
    that has them, ``arguments`` concatenated (OpenAI's streaming format)."""
    index: int = delta["index"] if isinstance(delta.get("index"), int) else len(calls)
    call: dict[str, Any] = calls.setdefault(index, {"id": None, "type": "function",
                                                    "function": {"name": None, "arguments": ""}})
    call["id"] = call["id"] or delta.get("id")
    call["type"] = delta.get("type") or call["type"]
    function: dict[str, Any] = delta["function"] if isinstance(delta.get("function"), dict) else {}
    call["function"]["name"] = call["function"]["name"] or function.get("name")
    if isinstance(function.get("arguments"), str):
        call["function"]["arguments"] += function["arguments"]
