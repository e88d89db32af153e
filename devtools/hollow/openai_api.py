"""The OpenAI-compatible half of the emulated engine: ``/v1/completions``, ``/v1/chat/completions``, ``/tokenize``.

Shapes are vLLM 0.32's (docs/vllm-cpu.md §5, ``vllm/entrypoints/openai``): errors ``{"error": {"message", "type",
"param", "code"}}``; a stream is server-sent events of ``text_completion`` / ``chat.completion.chunk`` chunks, each
carrying with ``stream_options.continuous_usage_stats`` the usage of its own choice so far (prompt tokens of its
prompt, completion tokens of that choice), then with ``include_usage`` a last chunk with no choices and the totals,
then ``data: [DONE]``. Choice ``i`` belongs to prompt ``i // n``. Tokens are made up (a hash of model, prompt and
position), so an adapter changes the answer as a real one would (the agent's effect probe sees it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from devtools.hollow.engine import HollowEngine, Sequence
from inference.node.effect_probe import PROBE_PROMPT

VOCAB = 1024
MAX_MODEL_LEN = 4096


class RequestError(Exception):
    """A request vLLM would refuse, rendered in vLLM's error shape."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param


def error_response(exc: RequestError) -> JSONResponse:
    """vLLM's error body for ``exc``."""
    return JSONResponse({"error": {"message": exc.message, "type": exc.err_type, "param": exc.param,
                                   "code": exc.status}}, status_code=exc.status)


def count_tokens(text: str) -> int:
    """A stand-in tokenizer: one token per 4 UTF-8 bytes, at least one."""
    return max(1, math.ceil(len(text.encode("utf-8")) / 4))


def chat_tokens(messages: Any) -> int:
    """Tokens of a chat prompt: each message's content plus 4 for the template's role markers."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty list", param="messages")
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        total += 4 + count_tokens(str(content or ""))
    return total


def prompts_of(body: dict[str, Any]) -> list[int]:
    """Token counts of a completions request's prompts (a string, a list of strings, or token id lists)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [count_tokens(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):
            return [len(prompt)]
        out = []
        for p in prompt:
            if isinstance(p, str):
                out.append(count_tokens(p))
            elif isinstance(p, list) and all(isinstance(t, int) for t in p):
                out.append(max(1, len(p)))
            else:
                raise RequestError(400, "prompt must be a string, a list of strings or of token ids", param="prompt")
        return out
    raise RequestError(400, "prompt must be a string, a list of strings or of token ids", param="prompt")


def _int_field(body: dict[str, Any], key: str, default: int, low: int) -> int:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise RequestError(400, f"{key} must be an integer >= {low}, got {value!r}", param=key)
    return value


def token(model: str, salt: str, index: int, position: int) -> int:
    """The made-up token at ``position`` of choice ``index``."""
    digest = hashlib.blake2b(f"{model}|{salt}|{index}|{position}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % VOCAB


class Exchange:
    """One completions or chat request in flight: its sequences and how to render its chunks."""

    def __init__(self, engine: HollowEngine, body: dict[str, Any], *, chat: bool) -> None:
        self.engine, self.body, self.chat = engine, body, chat
        model = body.get("model")
        if model in (None, engine.model):
            lora = None
        elif isinstance(model, str) and model in engine.served:
            lora = engine.served[model].lora_int_id
        else:
            raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        self.model = model or engine.model
        self.n = _int_field(body, "n", 1, 1)
        prompts = [chat_tokens(body.get("messages"))] if chat else prompts_of(body)
        default_max = 64 if chat else 16
        key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
        self.max_tokens = _int_field(body, key, default_max, 1)
        if max(prompts) + self.max_tokens > MAX_MODEL_LEN:
            raise RequestError(400, f"This model's maximum context length is {MAX_MODEL_LEN} tokens.",
                               param="max_tokens")
        self.prompts = prompts
        self.salt = json.dumps(body.get("messages") if chat else body.get("prompt"), sort_keys=True)[:200]
        self.want_ids = bool(body.get("return_token_ids"))
        self.want_logprobs = body.get("logprobs") not in (None, False, 0) or bool(body.get("top_logprobs"))
        options = body.get("stream_options") or {}
        self.include_usage = bool(options.get("include_usage"))
        self.continuous = bool(options.get("continuous_usage_stats"))
        self.rid = f"{'chatcmpl' if chat else 'cmpl'}-{engine.next_id():x}"
        self.created = int(time.time())
        self.event = asyncio.Event()
        # The node agent's effect probe after a load (its fixed prompt) runs like any request but is not a client's:
        # the engine's per-request counters (arrival tiers, request counts) leave it out.
        probe = not chat and body.get("prompt") == PROBE_PROMPT
        self.seqs: list[Sequence] = [engine.submit(p, self.max_tokens, lora, event=self.event, first=k == 0,
                                                   probe=probe)
                                     for k, p in enumerate(p for p in prompts for _ in range(self.n))]

    def abort(self) -> None:
        """Drop every unfinished sequence (the client went away)."""
        for seq in self.seqs:
            self.engine.abort(seq)

    def _tokens(self, index: int, start: int, end: int) -> list[int]:
        return [token(self.model, self.salt, index, k) for k in range(start, end)]

    @staticmethod
    def _text(ids: list[int]) -> str:
        return "".join(f" t{i}" for i in ids)

    def _logprob(self, tid: int) -> float:
        return -((tid % 97) + 1) / 50.0

    def _usage(self) -> dict[str, int]:
        prompt = sum(self.prompts)
        completion = sum(s.generated for s in self.seqs)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _choice(self, index: int, ids: list[int], finish: str | None) -> dict[str, Any]:
        text = self._text(ids)
        choice: dict[str, Any]
        if self.chat:
            choice = {"index": index, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
            if self.want_logprobs:
                choice["logprobs"] = {"tokens": [f" t{i}" for i in ids],
                                      "token_logprobs": [self._logprob(i) for i in ids],
                                      "top_logprobs": None, "text_offset": []}
        if self.want_ids:
            choice["token_ids"] = ids
        return choice

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, int] | None) -> str:
        body = {"id": self.rid, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices}
        if usage is not None or self.include_usage:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"

    async def stream(self) -> AsyncIterator[str]:
        """The SSE body, chunk by chunk as the engine's steps produce tokens."""
        sent = [0] * len(self.seqs)
        finished = [False] * len(self.seqs)
        try:
            if self.chat:
                for i in range(len(self.seqs)):
                    yield self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}], None)
            while not all(finished):
                await self.event.wait()
                self.event.clear()
                for i, seq in enumerate(self.seqs):
                    if finished[i] or (seq.generated == sent[i] and not seq.done):
                        continue
                    ids = self._tokens(i, sent[i], seq.generated)
                    sent[i] = seq.generated
                    finish = "length" if seq.done else None
                    finished[i] = seq.done
                    for k, tid in enumerate(ids):
                        last = k == len(ids) - 1
                        usage = None
                        if self.continuous:
                            prompt = self.prompts[i // self.n]
                            done_here = sent[i] - len(ids) + k + 1
                            usage = {"prompt_tokens": prompt, "completion_tokens": done_here,
                                     "total_tokens": prompt + done_here}
                        yield self._chunk([self._choice(i, [tid], finish if last else None)], usage)
            if self.include_usage:
                yield self._chunk([], self._usage())
            yield "data: [DONE]\n\n"
        finally:
            self.abort()

    async def whole(self) -> dict[str, Any]:
        """The unstreamed answer, once every sequence is done."""
        try:
            while not all(seq.done for seq in self.seqs):
                self.event.clear()
                await self.event.wait()
        finally:
            self.abort()
        choices = []
        for i, seq in enumerate(self.seqs):
            ids = self._tokens(i, 0, seq.generated)
            choice = self._choice(i, ids, "length")
            if self.chat:
                choice = {"index": i, "message": {"role": "assistant", "content": self._text(ids)},
                          "logprobs": None, "finish_reason": "length"}
            choices.append(choice)
        return {"id": self.rid, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, "usage": self._usage(),
                "system_fingerprint": self.engine.fingerprint}


async def completions(engine: HollowEngine, body: dict[str, Any], *, chat: bool) -> Response:
    """Serve one completions / chat completions request (streamed when ``stream`` is true)."""
    try:
        exchange = Exchange(engine, body, chat=chat)
    except RequestError as exc:
        return error_response(exc)
    if body.get("stream"):
        return StreamingResponse(exchange.stream(), media_type="text/event-stream")
    return JSONResponse(await exchange.whole())


def tokenize(engine: HollowEngine, body: dict[str, Any]) -> Response:
    """vLLM's ``POST /tokenize``: ``{"count", "max_model_len", "tokens"}`` for a prompt or chat messages."""
    try:
        if "messages" in body:
            count = chat_tokens(body.get("messages"))
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise RequestError(400, "prompt must be a string", param="prompt")
            count = count_tokens(prompt)
        model = body.get("model")
        if model not in (None, engine.model) and model not in engine.served:
            raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    except RequestError as exc:
        return error_response(exc)
    return JSONResponse({"count": count, "max_model_len": MAX_MODEL_LEN,
                         "tokens": [token(str(model), "tok", 0, k) for k in range(count)]})


def models(engine: HollowEngine) -> dict[str, Any]:
    """vLLM's ``GET /v1/models``: the base model, then each served adapter with ``parent`` = the base."""
    created = int(time.time())
    data = [{"id": engine.model, "object": "model", "created": created, "owned_by": "vllm", "root": engine.model,
             "parent": None, "max_model_len": MAX_MODEL_LEN}]
    data += [{"id": s.lora_name, "object": "model", "created": created, "owned_by": "vllm", "root": s.lora_path,
              "parent": engine.model, "max_model_len": None} for s in engine.served.values()]
    return {"object": "list", "data": data}
