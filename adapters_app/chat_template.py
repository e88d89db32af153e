"""A base model's chat template, compiled and rendered as transformers renders it for vLLM (pure: no I/O).

vLLM turns a chat request's messages into a prompt with ``tokenizer.apply_chat_template`` (``vllm/renderers/hf.py``,
``safe_apply_chat_template``), which renders the model's Jinja template in transformers' sandbox
(``transformers/utils/chat_template_utils.py``, ``_compile_jinja_template``): ``trim_blocks`` and ``lstrip_blocks``,
the ``loopcontrols`` extension, a ``tojson`` filter that keeps non-ASCII text and escapes no HTML, and the globals
``raise_exception`` and ``strftime_now``; the template sees ``messages``, ``tools``, ``documents``,
``add_generation_prompt`` and the tokenizer's special tokens (``bos_token``, ``eos_token``, ...). The same here, so the
gateway counts a chat's prompt without asking the engine (``inference.gateway.prompt_counter``). Templates that use
transformers' own ``{% generation %}`` tag do not compile here; their chats are counted by the engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# transformers' SPECIAL_TOKENS_ATTRIBUTES less the list-valued one: what ``special_tokens_map`` hands a template.
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TEMPLATE_MAX_CHARS = 256 * 1024  # the largest published templates (tool-calling ones) are under 20 KB


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)  # noqa: DTZ005 - transformers' own: the node's local date


def compile_chat_template(text: str) -> jinja2.Template:
    """A chat template's text → a compiled template in transformers' sandbox.

    Raises:
        ValueError: the text is over :data:`TEMPLATE_MAX_CHARS` or is not a template this sandbox compiles (the
            message says which).
    """
    if len(text) > TEMPLATE_MAX_CHARS:
        raise ValueError(f"chat template is over {TEMPLATE_MAX_CHARS // 1024} KiB")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(text)
    except jinja2.TemplateError as exc:
        raise ValueError(f"chat template does not compile: {exc}") from exc


def special_tokens_from_config(tokenizer_config: Mapping[str, Any]) -> dict[str, str]:
    """The special tokens a template sees, from a ``tokenizer_config.json``: each of :data:`SPECIAL_TOKEN_KEYS`
    that is set, as its text (the file holds a string or an ``AddedToken`` object with ``content``)."""
    tokens: dict[str, str] = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = tokenizer_config.get(key)
        if isinstance(value, Mapping):
            value = value.get("content")
        if isinstance(value, str):
            tokens[key] = value
    return tokens


def chat_template_from_files(jinja_text: str | None, tokenizer_config: Mapping[str, Any]) -> str:
    """The template vLLM's tokenizer would use: ``chat_template.jinja`` when the folder has one, else
    ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of named templates whose ``default`` it
    takes, as transformers does); ``""`` when there is none."""
    if jinja_text:
        return jinja_text
    value = tokenizer_config.get("chat_template")
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        default = named.get("default")
        return default if isinstance(default, str) else ""
    return ""


def plain_chat(messages: Any) -> list[dict[str, str]] | None:
    """``messages`` as vLLM hands them to the template when every one is a plain ``{"role", "content"}`` text message
    of the system, user or assistant role; None otherwise (content parts, names, tool calls, the developer role that
    vLLM may rewrite: the engine renders those)."""
    if not isinstance(messages, list) or not messages:
        return None
    plain = []
    for message in messages:
        if (not isinstance(message, dict) or message.keys() != {"role", "content"}
                or message["role"] not in ("system", "user", "assistant") or not isinstance(message["content"], str)):
            return None
        plain.append({"role": message["role"], "content": message["content"]})
    return plain


def render_chat(template: jinja2.Template, messages: Sequence[Mapping[str, Any]],
                special_tokens: Mapping[str, str], tools: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The prompt text vLLM builds for a chat request of ``messages`` and ``tools`` (none by default; no documents,
    a generation prompt added, as its chat route's defaults are).

    Raises:
        jinja2.TemplateError: the template refused the messages (``raise_exception``) or failed to render.
    """
    return template.render(messages=list(messages), tools=list(tools) if tools else None, documents=None,
                           add_generation_prompt=True, **special_tokens)


def template_inputs(messages: Any, tools: Any) -> tuple[list[Any], list[Any] | None]:
    """A chat request's ``messages`` and ``tools`` close to what vLLM hands its chat template: each tool as vLLM's
    tool model dumps it (``ChatCompletionToolsParam.model_dump``: ``type``, and ``function`` with ``name``,
    ``description`` and ``parameters``, null when absent, ``strict`` and ``defer_loading`` only when set, the tool's
    own ``defer_loading`` handed down to its function; other keys dropped), a message's text parts joined with
    newlines into one string (vLLM's ``string`` content format). Other fields are passed as sent; a render of them
    sizes a prompt (``inference.gateway.prompt_counter.PromptCounter.chat_bytes``), it does not count it."""
    out_messages = []
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            parts = message["content"]
            text = "\n".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
            message = {**message, "content": text}
        out_messages.append(message)
    if not isinstance(tools, list) or not tools:
        return out_messages, None
    out_tools: list[Any] = []
    for tool in tools:
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
            sent = tool["function"]
            function = {"name": sent.get("name"), "description": sent.get("description"),
                        "parameters": sent.get("parameters")}
            if sent.get("strict") is not None:
                function["strict"] = sent["strict"]
            deferred = sent.get("defer_loading")
            deferred = tool.get("defer_loading") if deferred is None else deferred
            if deferred is not None:
                function["defer_loading"] = deferred
            outer = tool.get("defer_loading")
            tool = {"type": tool.get("type") or "function", "function": function}
            if outer is not None:
                tool["defer_loading"] = outer
        out_tools.append(tool)
    return out_messages, out_tools
