"""The base model's own tokenizer in each gateway process: completion prompts counted for tokens-per-minute
reservations without a round trip to the engine.

vLLM counts a completion prompt with its fast tokenizer, ``encode(prompt, add_special_tokens=True)`` (the default
of its completions route and of ``/tokenize``): the Hugging Face ``tokenizers`` library over the model's
``tokenizer.json``. The gateway loads the same file, stored when the base model was registered
(``adapters_app.models.BaseModelTokenizer``), once per base model and process. A short prompt is counted on the event
loop (about 30 µs against about 2.8 ms for ``/tokenize``, measured in ``scripts/bench_gateway``'s TPM rows); a long
one in a worker thread, since ``encode_batch`` releases the GIL and ``encode`` does not (100,000 characters held the
loop 150 ms). A chat of plain text messages is rendered with the model's chat template as vLLM renders it
(``adapters_app.chat_template``, stored beside the tokenizer) and its text counted without special tokens added (the
template writes them, and vLLM's chat route adds none); other chats (content parts, tools, names) and models stored
without a template are counted by the engine.

Trust, then check: the first :data:`CHECK_FIRST` counts of each stored tokenizer, and one in :data:`CHECK_EVERY`
after, are compared with the prompt counts the serving engine reports in the request's own usage
(``inference.gateway.prompt_counts``), and the same for chats: no prompt goes to any other node for a check. A
difference is logged (``gateway.tokenizer_mismatch``, once per node); once :data:`RETIRE_AFTER_NODES` distinct nodes
disagreed it retires that tokenizer (a chat's: its chat template only) for its base model in this process, so the
next requests are counted by the engine again until the base model is registered with other files. One node's word
never retires it: a host holding a stolen node key, answering as its node, did so for the whole process by
disagreeing once (issue 30). Until then a reservation can be off by that difference; the bill is the engine's own
count either way (bounded, ``exchange.usage_bounded``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2
from tokenizers import Tokenizer

from adapters_app.chat_template import compile_chat_template, plain_chat, render_chat, template_inputs
from adapters_app.models import BaseModelTokenizer
from inference.gateway.directory import db_call

logger = logging.getLogger(__name__)

CHECK_FIRST = 16  # counts of a newly loaded tokenizer compared with the engine's
CHECK_EVERY = 256  # then one in this many
RECHECK_S = 60.0  # how often a process asks the database whether a base model's tokenizer changed
INLINE_MAX_CHARS = 2_048  # prompts up to this many characters in all are counted on the event loop
LOAD_WAIT_S = 5.0  # how long sizing a chat (chat_bytes) waits for this process's load of its template
RETIRE_AFTER_NODES = 2  # distinct nodes whose counts must differ before a tokenizer (or chat template) is retired


@dataclass(frozen=True)
class TokenizerFiles:
    """What :class:`BaseModelTokenizer` stores: ``tokenizer.json`` text, the chat template (``""``: none) and the
    special tokens the template sees."""

    tokenizer_json: str
    chat_template: str = ""
    special_tokens: dict[str, str] = field(default_factory=dict)


Stored = tuple[str | None, TokenizerFiles | None]  # (sha256 or None when none is stored, the files when new)


def stored_tokenizer(base_model_id: int, known_sha256: str | None) -> Stored:
    """The base model's stored tokenizer: ``(sha256, files)``; ``files`` is None when it is ``known_sha256``
    (nothing to reload), ``(None, None)`` when none is stored. Database reads; run on the gateway's database
    thread."""
    sha = BaseModelTokenizer.objects.filter(pk=base_model_id).values_list("sha256", flat=True).first()
    if sha is None or sha == known_sha256:
        return sha, None
    row = (BaseModelTokenizer.objects.filter(pk=base_model_id)
           .values_list("tokenizer_json", "chat_template", "special_tokens").first())
    if row is None:
        return None, None
    return sha, TokenizerFiles(row[0], row[1] or "", dict(row[2] or {}))


def parse_tokenizer(text: str) -> Tokenizer:
    """``tokenizer.json`` text → a ``tokenizers.Tokenizer`` that counts as vLLM does: no truncation or padding
    (a file saved with a ``max_length`` truncation would otherwise cut the count, while vLLM refuses the prompt).

    Raises:
        Exception: the ``tokenizers`` library's own, for text it cannot load.
    """
    tokenizer = Tokenizer.from_str(text)
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


@dataclass
class _Entry:
    sha256: str | None = None  # of the stored tokenizer this entry holds; None: none stored
    tokenizer: Tokenizer | None = None
    looked_at: float = float("-inf")  # monotonic time of the last database look
    counted: int = 0  # counts made with this tokenizer
    retired: bool = False  # it disagreed with the engine: unused until the stored one changes
    template: jinja2.Template | None = None  # the compiled chat template; None: chats are counted by the engine
    special_tokens: dict[str, str] = field(default_factory=dict)
    chats_counted: int = 0
    chat_retired: bool = False  # chat counts disagreed with the engines: chats go to them until the files change
    disagreed: set[str] = field(default_factory=set)  # nodes whose engine counted a prompt otherwise
    chat_disagreed: set[str] = field(default_factory=set)  # nodes whose engine counted a chat otherwise
    loading: asyncio.Task[None] | None = None


class PromptCounter:
    """Per base model, the stored tokenizer of this process (loaded in the background on first need, looked up again
    every :data:`RECHECK_S`), and completion prompts' token counts with it.

    ``fetch`` reads what is stored (``stored_tokenizer`` through the gateway's database thread by default);
    ``clock`` is monotonic seconds. Both are parameters for tests.
    """

    def __init__(self, *, fetch: Callable[[int, str | None], Awaitable[Stored]] | None = None,
                 clock: Callable[[], float] = time.monotonic, recheck_s: float = RECHECK_S,
                 inline_max_chars: int = INLINE_MAX_CHARS, load_wait_s: float = LOAD_WAIT_S) -> None:
        self._fetch = fetch or (lambda pk, sha: db_call(stored_tokenizer, pk, sha))
        self._clock = clock
        self._recheck_s = recheck_s
        self._inline_max_chars = inline_max_chars
        self._load_wait_s = load_wait_s
        self._entries: dict[int, _Entry] = {}

    def ready(self, base_model_id: int) -> Tokenizer | None:
        """The base model's tokenizer when this process holds one it trusts, else None (count with the engine).
        Starts a background look in the database when there is none yet or the last look is older than the
        recheck interval; never waits for it."""
        entry = self._entries.setdefault(base_model_id, _Entry())
        if entry.loading is None and self._clock() - entry.looked_at >= self._recheck_s:
            entry.loading = asyncio.get_running_loop().create_task(self._refresh(base_model_id, entry))
        return None if entry.retired else entry.tokenizer

    async def _refresh(self, base_model_id: int, entry: _Entry) -> None:
        try:
            sha, files = await self._fetch(base_model_id, entry.sha256)
            if sha is None:
                entry.sha256, entry.tokenizer, entry.retired, entry.template = None, None, False, None
            elif files is not None:
                tokenizer = await asyncio.to_thread(parse_tokenizer, files.tokenizer_json)
                template = None
                if files.chat_template:
                    try:
                        template = compile_chat_template(files.chat_template)
                    except ValueError as exc:  # registration checks it; a row written otherwise counts chats remotely
                        logger.warning("gateway.chat_template_unusable", extra={"base_model_id": base_model_id,
                                                                                "error": str(exc)})
                entry.sha256, entry.tokenizer, entry.counted, entry.retired = sha, tokenizer, 0, False
                entry.template, entry.special_tokens = template, files.special_tokens
                entry.chats_counted, entry.chat_retired = 0, False
                entry.disagreed, entry.chat_disagreed = set(), set()
                logger.info("gateway.tokenizer_loaded", extra={"base_model_id": base_model_id, "sha256": sha,
                                                               "chat_template": template is not None})
        except Exception as exc:  # a failed look keeps what this process had; the next recheck tries again
            logger.warning("gateway.tokenizer_load_failed", extra={"base_model_id": base_model_id,
                                                                   "error": repr(exc)})
        finally:
            entry.looked_at = self._clock()
            entry.loading = None

    async def count(self, base_model_id: int, texts: Sequence[str]) -> list[int] | None:
        """Each text's token count as vLLM's completions route counts it (special tokens added), in order; None when
        this process has no trusted tokenizer for the base model yet (the caller asks the engine)."""
        tokenizer = self.ready(base_model_id)
        if tokenizer is None:
            return None
        entry = self._entries[base_model_id]
        entry.counted += len(texts)
        if sum(len(text) for text in texts) <= self._inline_max_chars:
            return [len(tokenizer.encode(text, add_special_tokens=True)) for text in texts]
        encodings = await asyncio.to_thread(tokenizer.encode_batch, list(texts), add_special_tokens=True)
        return [len(encoding) for encoding in encodings]

    async def count_chat(self, base_model_id: int, messages: object) -> int | None:
        """A chat's prompt token count as vLLM's chat route counts it (the chat template rendered, no special tokens
        added); None when this process cannot count it (no trusted tokenizer or template, messages other than plain
        text, a template that refuses them): the caller asks the engine."""
        tokenizer = self.ready(base_model_id)
        entry = self._entries[base_model_id]
        plain = plain_chat(messages)
        if tokenizer is None or entry.template is None or entry.chat_retired or plain is None:
            return None
        try:
            text = render_chat(entry.template, plain, entry.special_tokens)
        except jinja2.TemplateError:
            return None  # the engine answers the template's refusal in its own words
        entry.chats_counted += 1
        if len(text) <= self._inline_max_chars:
            return len(tokenizer.encode(text, add_special_tokens=False))
        encodings = await asyncio.to_thread(tokenizer.encode_batch, [text], add_special_tokens=False)
        return len(encodings[0])

    async def chat_bytes(self, base_model_id: int, messages: Any, tools: Any, *, size: int) -> int | None:
        """The size in UTF-8 bytes of the prompt text the base model's chat template renders for a chat's
        ``messages`` and ``tools`` (``adapters_app.chat_template.template_inputs``: as vLLM hands them to it), or
        None when this process cannot render it: no template stored, one that does not compile here, one that
        refuses the messages, or no load within ``load_wait_s`` seconds (a load in progress is waited for; the
        first call for a base model starts one).

        A byte-level BPE count of the text is at most this (every token covers a byte at least; a special token
        written as text, several), whatever the template adds: the billing cap's size for a chat whose template
        writes more than the request holds (``inference.gateway.exchange.usage_bounded``). ``size`` is the
        request's size in bytes: up to ``inline_max_chars`` the template renders on the event loop, above it in a
        worker thread (a 4 MB chat would hold the loop tens of ms). The tokenizer is not used.
        """
        self.ready(base_model_id)
        entry = self._entries[base_model_id]
        if entry.loading is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(entry.loading), self._load_wait_s)
        template, special_tokens = entry.template, entry.special_tokens
        if template is None:
            return None
        rendered_messages, rendered_tools = template_inputs(messages, tools)

        def render() -> int:
            text = render_chat(template, rendered_messages, special_tokens, rendered_tools)
            return len(text.encode("utf-8", "surrogatepass"))

        try:
            return render() if size <= self._inline_max_chars else await asyncio.to_thread(render)
        except Exception as exc:  # noqa: BLE001 - a template refusing these messages, or failing on them: no size
            logger.info("gateway.chat_template_render_failed", extra={"base_model_id": base_model_id,
                                                                      "error": repr(exc)[:200]})
            return None

    def wants_check(self, base_model_id: int, *, chat: bool = False) -> bool:
        """Whether the count just made (a chat's with ``chat``) should be compared with the engine's: the first
        :data:`CHECK_FIRST` of a tokenizer, then one in :data:`CHECK_EVERY`, prompts and chats apart."""
        entry = self._entries.get(base_model_id)
        if entry is None or entry.tokenizer is None or entry.retired or (chat and entry.chat_retired):
            return False
        counted = entry.chats_counted if chat else entry.counted
        return counted <= CHECK_FIRST or counted % CHECK_EVERY == 0

    def checked(self, base_model_id: int, *, local: int, engine: int | None, node: str, chat: bool = False) -> bool:
        """Record node ``node``'s engine count of a prompt (a chat with ``chat``) this process counted ``local``.

        A difference is logged once per node (``gateway.tokenizer_mismatch``); the tokenizer, or for a chat its
        template only, is retired (until the stored files change) once :data:`RETIRE_AFTER_NODES` distinct nodes
        differed, never on one node's word. Returns whether they agreed (True when the engine gave no count).
        """
        entry = self._entries.get(base_model_id)
        if engine is None or entry is None or local == engine:
            return True
        nodes = entry.chat_disagreed if chat else entry.disagreed
        if node not in nodes:
            nodes.add(node)
            retire = len(nodes) >= RETIRE_AFTER_NODES
            if chat:
                entry.chat_retired = entry.chat_retired or retire
            else:
                entry.retired = entry.retired or retire
            logger.warning("gateway.tokenizer_mismatch", extra={
                "base_model_id": base_model_id, "sha256": entry.sha256, "local": local, "engine": engine,
                "chat": chat, "node": node, "nodes_disagreeing": len(nodes), "retired": retire})
        return False
