"""Request hygiene: type-check an OpenAI completion body and build what the engine may see.

Every field is checked against OpenAI's reference (platform.openai.com/docs/api-reference/completions and /chat)
and vLLM 0.32's extensions (``vllm/entrypoints/openai/{completion,chat_completion}/protocol.py``); a bad one is a
400 naming it. Only an allow-list reaches vLLM: fields the platform sets itself (``request_id``, ``cache_salt``,
``priority``, ``kv_transfer_params``, ``chat_template``...) are refused, unknown ones too (as OpenAI does:
"Unrecognized request argument supplied"). ``cache_salt`` is set per tenant, so prefix-cache blocks are never shared
between tenants (a timing side channel otherwise; vLLM's ``cache_salt`` docs).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from common.echo import clip
from inference.gateway.errors import GatewayError

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# Content part types a message may hold (the served models take text only), by role; others: text.
TEXT_PARTS = {"assistant": ("text", "refusal")}
# OpenAI's (and vLLM's) non-text part types: refused with a hint that the model takes text only.
MEDIA_PARTS = frozenset({"image_url", "input_image", "input_audio", "audio_url", "video_url", "file", "image_embeds",
                         "audio_embeds", "video_embeds", "image_pil", "prompt_embeds"})
# Accepted from OpenAI clients, meaningless here: dropped, not forwarded.
IGNORED = frozenset({"metadata", "store", "service_tier", "user"})
# Set by the platform or engine internals: a tenant may not send them.
PLATFORM_FIELDS = frozenset({
    "request_id", "cache_salt", "priority", "kv_transfer_params", "lora_request", "vllm_xargs", "chat_template",
    "chat_template_kwargs", "mm_processor_kwargs", "data_parallel_rank", "prompt_embeds", "session_id",
    "return_tokens_as_token_ids", "routed_experts_prompt_start", "mm_payload", "return_mm_kwargs",
    "logits_processors", "prompt_logprobs",
})


@dataclass(frozen=True)
class Caps:
    """Per-request caps (None = uncapped): ``max_tokens`` (tokens), ``n`` (choices, also bounds ``best_of``),
    ``logprobs`` (completions' ``logprobs`` and chat's ``top_logprobs``)."""

    max_tokens: int | None = None
    max_tokens_by: str = "key"  # whose cap max_tokens is ("key" or "tenant"), named in the 400
    n: int = 8
    logprobs: int = 5


def _bad(field: str, message: str) -> GatewayError:
    return GatewayError(400, f"Invalid '{field}': {message}", code="invalid_value", param=field)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool)) and math.isfinite(v)


def _bool(f: str, v: Any) -> None:
    if not isinstance(v, bool):
        raise _bad(f, f"expected a boolean (true or false), got {type(v).__name__} {v!r:.40}.")


def _string(f: str, v: Any) -> None:
    if not isinstance(v, str):
        raise _bad(f, f"expected a string, got {type(v).__name__}.")


def _optional_string(f: str, v: Any) -> None:
    if v is not None:
        _string(f, v)


# Bounds the engine's C/torch side takes (int32): past them vLLM answered 500 (top_k 2**64 as a 502 here).
INT32_MAX = 2**31 - 1


def _token_id(v: Any) -> bool:
    return _is_int(v) and 0 <= v <= INT32_MAX


def _int(lo: int | None = None, hi: int | None = None, nullable: bool = True) -> Callable[[str, Any], None]:
    def check(f: str, v: Any) -> None:
        if v is None and nullable:
            return
        if not _is_int(v):
            raise _bad(f, f"expected an integer, got {type(v).__name__} {v!r:.40}.")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise _bad(f, f"{clip(v)} is outside [{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}].")
    return check


def _num(lo: float, hi: float, *, open_low: bool = False) -> Callable[[str, Any], None]:
    def check(f: str, v: Any) -> None:
        if v is None:
            return
        if not _is_num(v):
            raise _bad(f, f"expected a finite number, got {type(v).__name__} {v!r:.40}.")
        if v < lo or v > hi or (open_low and v == lo):
            raise _bad(f, f"{v} is outside {'(' if open_low else '['}{lo}, {hi}].")
    return check


def _stop(f: str, v: Any) -> None:
    if v is None:
        return
    if not isinstance(v, str | list) or (isinstance(v, list) and (len(v) > 4 or not all(isinstance(s, str)
                                                                                       for s in v))):
        raise _bad(f, "expected a string or a list of at most 4 strings.")
    if v == "" or (isinstance(v, list) and "" in v):
        # vLLM refuses it ("stop cannot contain an empty string"): an empty stop would end every completion at once.
        raise _bad(f, "a stop sequence cannot be an empty string; leave 'stop' out (or send null) for none.")


def _stream_options(f: str, v: Any) -> None:
    if v is None:
        return
    if not isinstance(v, dict):
        raise _bad(f, f"expected an object like {{\"include_usage\": true}}, got {type(v).__name__} {v!r:.40}.")
    for k, val in v.items():
        if k not in ("include_usage", "continuous_usage_stats"):
            raise _bad(f"{f}.{clip(k, 40)}", "unknown option; allowed: include_usage.")
        _bool(f"{f}.{k}", val)


def _logit_bias(f: str, v: Any) -> None:
    if v is None:
        return
    if not isinstance(v, dict) or not all(isinstance(k, str) and k.lstrip("-").isdigit() and _is_num(b)
                                          and -100 <= b <= 100 for k, b in v.items()):
        raise _bad(f, "expected an object mapping token ids to numbers in [-100, 100].")


def _int_list(f: str, v: Any) -> None:
    if v is not None and not (isinstance(v, list) and all(_token_id(i) for i in v)):
        raise _bad(f, "expected a list of token ids (non-negative integers).")


def _obj(f: str, v: Any) -> None:
    if v is not None and not isinstance(v, dict):
        raise _bad(f, f"expected an object, got {type(v).__name__}.")


# Bounds on what the engine's grammar compiler (xgrammar) is handed: a 20,000-entry enum held it 39 s for every
# tenant on the node, and a pattern "a{10000}" crashed it (attack round: response_format was only type-checked).
MAX_SCHEMA_BYTES = 16 * 1024
MAX_TOOLS_BYTES = 64 * 1024  # tools are prompt text too; a grammar only under tool_choice "required" or a name
MAX_PATTERN_REPEAT = 1000
_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def _grammar(f: str, v: Any, max_bytes: int = MAX_SCHEMA_BYTES) -> None:
    """``response_format`` (and ``tools``, whose parameters become a grammar under ``tool_choice``): JSON of at most
    ``max_bytes`` and no regex repetition count over ``MAX_PATTERN_REPEAT``."""
    if v is None:
        return
    text = json.dumps(v, separators=(",", ":"), ensure_ascii=False, default=str)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise _bad(f, f"{size} bytes as JSON, over the cap of {max_bytes} bytes for a schema or tool "
                      "definitions; shorten it (fewer enum values, shared definitions).")
    for match in _REPEAT.finditer(text):
        counts = [int(g) for g in match.groups() if g]
        if any(c > MAX_PATTERN_REPEAT for c in counts):
            raise _bad(f, f"a pattern repeats {clip(max(counts))} times, over the cap of {MAX_PATTERN_REPEAT}; "
                          "use a shorter repetition or 'maxLength'.")


def _response_format(f: str, v: Any) -> None:
    _obj(f, v)
    _grammar(f, v)


def _tools(f: str, v: Any) -> None:
    _list(f, v)
    _grammar(f, v, MAX_TOOLS_BYTES)


def _list(f: str, v: Any) -> None:
    if v is not None and not isinstance(v, list):
        raise _bad(f, f"expected a list, got {type(v).__name__}.")


def _tool_choice(f: str, v: Any) -> None:
    if v is not None and not isinstance(v, str | dict):
        raise _bad(f, "expected \"none\", \"auto\", \"required\" or an object naming a function.")


def _prompt(f: str, v: Any) -> None:
    ok = (isinstance(v, str)
          or (isinstance(v, list) and v and (all(isinstance(p, str) for p in v)
                                             or all(_token_id(t) for t in v)
                                             or all(isinstance(p, list) and p and all(_token_id(t) for t in p)
                                                    for p in v))))
    if not ok:
        raise _bad(f, "expected a string, a non-empty list of strings, or token ids.")


def _content_parts(where: str, role: str, parts: list[Any]) -> None:
    """The parts of a list ``content``: ``{"type": "text", "text": str}``, and in an assistant message also
    ``{"type": "refusal", "refusal": str}``. The served models take text only, so image, audio and file parts are
    refused here rather than by the engine (a 400 without ``param``)."""
    for j, part in enumerate(parts):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise _bad(at, f"expected a content part object like {{\"type\": \"text\", \"text\": \"...\"}}, "
                       f"got {type(part).__name__}.")
        kind = part.get("type")
        allowed = TEXT_PARTS[role] if role in TEXT_PARTS else ("text",)
        if kind is None:
            raise GatewayError(400, f"Missing required parameter: '{at}.type'; use \"text\".",
                               code="missing_required_parameter", param=f"{at}.type")
        if kind not in allowed:
            shown = f"{kind!r:.40}" if isinstance(kind, str) else type(kind).__name__
            media = isinstance(kind, str) and kind in MEDIA_PARTS
            raise _bad(f"{at}.type", f"got {shown}; "
                       + ("this model takes text only, so send the content as text parts. " if media else "")
                       + f"Allowed here: {', '.join(repr(a) for a in allowed)}.")
        for key in part:
            if key not in ("type", kind):
                raise GatewayError(400, f"Unknown parameter: '{at}.{key:.40}'; a {kind!r} part holds 'type' and "
                                   f"{kind!r} only.", code="unknown_parameter", param=f"{at}.{key:.40}")
        value = part.get(kind)
        if not isinstance(value, str):
            if value is None:
                raise GatewayError(400, f"Missing required parameter: '{at}.{kind}' (a string).",
                                   code="missing_required_parameter", param=f"{at}.{kind}")
            raise _bad(f"{at}.{kind}", f"expected a string, got {type(value).__name__}.")


def _tool_calls(where: str, role: str, calls: Any) -> None:
    """An assistant message's ``tool_calls``, in OpenAI's shape: ``[{"id": str, "type": "function", "function":
    {"name": str, "arguments": str}}]`` (vLLM also takes ``arguments`` as an object)."""
    if calls is None:
        return
    if role != "assistant":
        raise GatewayError(400, f"Unknown parameter: '{where}'; only assistant messages carry 'tool_calls'.",
                           code="unknown_parameter", param=where)
    if not isinstance(calls, list):
        raise _bad(where, f"expected a list of tool calls, got {type(calls).__name__}.")
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        if not isinstance(call, dict):
            raise _bad(at, "expected an object like {\"id\": \"call_1\", \"type\": \"function\", \"function\": "
                       "{\"name\": \"...\", \"arguments\": \"{}\"}}.")
        if not isinstance(call.get("id"), str) or not call["id"]:
            raise _bad(f"{at}.id", "expected the call's id, a non-empty string (tool messages answer it by "
                       "'tool_call_id').")
        if call.get("type") != "function":
            raise _bad(f"{at}.type", f"expected \"function\", got {call.get('type')!r:.40}.")
        function = call.get("function")
        if not isinstance(function, dict):
            raise _bad(f"{at}.function", "expected an object with 'name' and 'arguments'.")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise _bad(f"{at}.function.name", "expected the function's name, a non-empty string.")
        if not isinstance(function.get("arguments"), str | dict):
            raise _bad(f"{at}.function.arguments", "expected the arguments as a JSON string, e.g. \"{}\".")


def _messages(f: str, v: Any) -> None:
    if not isinstance(v, list) or not v:
        raise _bad(f, "expected a non-empty list of {\"role\", \"content\"} objects.")
    for i, m in enumerate(v):
        where = f"{f}[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, "expected an object with 'role' and 'content'.")
        if m.get("role") not in ROLES:
            raise _bad(f"{where}.role", f"expected one of {sorted(ROLES)}, got {m.get('role')!r:.40}.")
        content = m.get("content")
        if not (content is None or isinstance(content, str | list)):
            raise _bad(f"{where}.content", "expected a string or a list of content parts.")
        if isinstance(content, list):
            _content_parts(f"{where}.content", m["role"], content)
        if content is None and m["role"] != "assistant":
            raise _bad(f"{where}.content", "is required for this role.")
        _tool_calls(f"{where}.tool_calls", m["role"], m.get("tool_calls"))


COMMON: dict[str, Callable[[str, Any], None]] = {
    # Bounded: max_tokens=10**4000 passed as an integer and was a 500 (OverflowError in the fair-share cost), the
    # request's admission left unsettled (attack round); vLLM refuses any over the context anyway.
    "stream": _bool, "stream_options": _stream_options, "max_tokens": _int(1, INT32_MAX), "temperature": _num(0, 2),
    "top_p": _num(0, 1, open_low=True), "n": _int(1, nullable=False), "stop": _stop,
    "presence_penalty": _num(-2, 2), "frequency_penalty": _num(-2, 2), "seed": _int(-(2**63), 2**63 - 1),
    "logit_bias": _logit_bias, "response_format": _response_format,
    # vLLM extensions (sampling only)
    "top_k": _int(-1, INT32_MAX), "min_p": _num(0, 1), "repetition_penalty": _num(0, 10, open_low=True), "ignore_eos": _bool,
    "min_tokens": _int(0, INT32_MAX), "stop_token_ids": _int_list, "skip_special_tokens": _bool,
    "spaces_between_special_tokens": _bool, "include_stop_str_in_output": _bool, "return_token_ids": _bool,
}
COMPLETIONS = {**COMMON, "prompt": _prompt, "echo": _bool, "suffix": _optional_string,
               "logprobs": _int(0), "best_of": _int(1)}
CHAT = {**COMMON, "messages": _messages, "max_completion_tokens": _int(1, INT32_MAX), "logprobs": _bool,
        "top_logprobs": _int(0), "tools": _tools, "tool_choice": _tool_choice, "parallel_tool_calls": _bool,
        "add_generation_prompt": _bool, "continue_final_message": _bool, "echo": _bool}
REQUIRED = {"completions": "prompt", "chat/completions": "messages"}


@lru_cache(maxsize=4096)
def cache_salt(tenant_id: int, secret: str) -> str:
    """The tenant's vLLM ``cache_salt``: HMAC-SHA256 of its id (hex, 32 chars; stable, unguessable; memoised)."""
    return hmac.new(secret.encode(), f"cache-salt:{tenant_id}".encode(), hashlib.sha256).hexdigest()[:32]


def upstream_body(body: Mapping[str, Any], *, endpoint: str, caps: Caps, salt: str) -> dict[str, Any]:
    """The body to send vLLM for a checked request, without ``model`` (the caller sets the served name).

    Args:
        body: the client's JSON object (``model`` already checked).
        endpoint: ``completions`` or ``chat/completions``.
        caps: the caller's caps; a missing ``max_tokens`` becomes ``caps.max_tokens`` when capped.
        salt: the tenant's ``cache_salt``.

    Raises:
        GatewayError: 400 naming the first bad, unknown or platform-only field, or a cap exceeded.
    """
    spec = COMPLETIONS if endpoint == "completions" else CHAT
    out: dict[str, Any] = {}
    for field, value in body.items():
        if field == "model" or field in IGNORED:
            continue
        if field in PLATFORM_FIELDS:
            raise GatewayError(400, f"'{field}' is set by the platform and cannot be sent.", code="unsupported_parameter",
                               param=field)
        check = spec.get(field)
        if check is None:
            hint = (" Chat completions take 'messages', not 'prompt' (or call /v1/completions)."
                    if endpoint != "completions" and field == "prompt" else
                    " Completions take 'prompt', not 'messages' (or call /v1/chat/completions)."
                    if endpoint == "completions" and field == "messages" else "")
            raise GatewayError(400, f"Unrecognized request argument supplied: {clip(field)}.{hint}",
                               code="unknown_parameter", param=field)
        check(field, value)
        if value is not None:
            out[field] = value
    required = REQUIRED[endpoint]
    if required not in out:
        raise GatewayError(400, f"Missing required parameter: '{required}'.", code="missing_required_parameter",
                           param=required)
    if "stream_options" in out and not out.get("stream"):
        raise _bad("stream_options", "only allowed when 'stream' is true.")
    _refuse_prompt_logprobs(out, endpoint)
    _apply_caps(out, caps)
    _check_min_tokens(out)
    out["cache_salt"] = salt
    return out


def _apply_caps(out: dict[str, Any], caps: Caps) -> None:
    length_field = "max_completion_tokens" if "max_completion_tokens" in out else "max_tokens"
    if caps.max_tokens is not None:
        asked = out.get(length_field)
        if asked is None:
            out[length_field] = caps.max_tokens
        elif asked > caps.max_tokens:
            raise _bad(length_field, f"{clip(asked)} is over the cap of {caps.max_tokens} tokens a request set on "
                                     f"this {caps.max_tokens_by}; ask for at most {caps.max_tokens}.")
    n = out.get("n", 1)
    if n > caps.n:
        raise _bad("n", f"{clip(n)} is over the cap of {caps.n} choices.")
    prompts = prompt_count(out)
    if prompts * n > caps.n:  # each prompt of a list gets n choices: the same engine work as n × prompts
        raise _bad("prompt", f"{prompts} prompts × n {clip(n)} = {clip(prompts * n)} choices, over the cap of {caps.n} choices "
                   "a request; send the prompts in separate requests.")
    best_of = out.get("best_of")
    if best_of is not None and not n <= best_of <= caps.n:
        raise _bad("best_of", f"must lie between n ({clip(n)}) and the cap of {caps.n}.")
    for field in ("logprobs", "top_logprobs"):
        value = out.get(field)
        if isinstance(value, int) and _is_int(value) and value > caps.logprobs:
            raise _bad(field, f"{clip(value)} is over the cap of {caps.logprobs}.")


def _refuse_prompt_logprobs(out: Mapping[str, Any], endpoint: str) -> None:
    """Refuse the two spellings of ``prompt_logprobs`` (itself a platform field): vLLM turns ``echo`` with
    ``logprobs`` (completions) and ``echo`` alone (chat: ``top_logprobs`` defaults to 0) into prompt logprobs
    (``vllm/entrypoints/openai/*/protocol.py``, ``to_sampling_params``), and a batch computing them beside a LoRA
    request failed in the engine's LoRA kernel (``bgmv_shrink``), killing the engine for every tenant on the node
    (attack round, December 2026)."""
    if not out.get("echo"):
        return
    if endpoint == "completions" and out.get("logprobs") is not None:
        raise _bad("echo", "with 'logprobs' asks for the prompt's logprobs, which this service does not compute; "
                           "drop 'logprobs' (the prompt is still echoed) or 'echo'.")
    if endpoint != "completions":
        raise _bad("echo", "is not supported on chat completions (the engine would compute the prompt's logprobs); "
                           "drop it, and prepend the last message yourself if you need it.")


def _check_min_tokens(out: Mapping[str, Any]) -> None:
    """``min_tokens`` within the completion length (vLLM refuses it otherwise, after the limits were charged)."""
    min_tokens = out.get("min_tokens")
    length_field = "max_completion_tokens" if "max_completion_tokens" in out else "max_tokens"
    length = out.get(length_field)
    if min_tokens is not None and length is not None and min_tokens > length:
        raise _bad("min_tokens", f"{min_tokens} is over '{length_field}' ({length}); lower 'min_tokens' or raise "
                   f"'{length_field}'.")


def prompt_count(body: Mapping[str, Any]) -> int:
    """How many prompts a completions body holds: a list of strings or of token-id lists is one per item; a string,
    a flat token-id list or a chat body is one."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1


def requested_tokens(body: Mapping[str, Any]) -> int | None:
    """The completion budget the engine will honour (``max_completion_tokens``/``max_tokens`` × ``n`` × the
    prompts of a list), or None."""
    length = body.get("max_completion_tokens", body.get("max_tokens"))
    return None if length is None else int(length) * int(body.get("n", 1)) * prompt_count(body)


# A JSON \\uD800-\\uDFFF escape: json.loads turns an unpaired one into a str that cannot be encoded as UTF-8, which
# failed later as a 500 (the database query for `model`, token estimates, the engine). Paired ones are fine.
LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def refuse_lone_surrogates(body: dict[str, Any]) -> None:
    """Raise 400 naming the first top-level field holding a string that is not valid Unicode (an unpaired UTF-16
    surrogate, from a ``\\ud800``-style escape)."""
    for name, value in body.items():
        try:
            json.dumps({name: value}, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            field = name if name.encode("utf-8", "replace") == name.encode("utf-8", "surrogatepass") else "body"
            raise GatewayError(400, f"Invalid '{clip(field)}': it holds an unpaired UTF-16 surrogate (a \\ud800-\\udfff "
                               "escape without its pair), which is not text; send valid Unicode.",
                               code="invalid_value", param=field) from None
