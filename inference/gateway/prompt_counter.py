"""The base model's own tokenizer in each gateway process: completion prompts counted for tokens-per-minute
reservations without a round trip to the engine.

vLLM counts a completion prompt with its fast tokenizer, ``encode(prompt, add_special_tokens=True)`` (the default
of its completions route and of ``/tokenize``): the Hugging Face ``tokenizers`` library over the model's
``tokenizer.json``. The gateway loads the same file, stored when the base model was registered
(``adapters_app.models.BaseModelTokenizer``), once per base model and process. A short prompt is counted on the event
loop (about 30 µs against about 2.8 ms for ``/tokenize``, measured in ``scripts/bench_gateway``'s TPM rows); a long
one in a worker thread, since ``encode_batch`` releases the GIL and ``encode`` does not (100,000 characters held the
loop 150 ms). A chat is still counted by the engine: vLLM renders its chat template.

Trust, then check: the first :data:`CHECK_FIRST` counts of each stored tokenizer, and one in :data:`CHECK_EVERY`
after, are compared in the background with the engine's ``/tokenize``. A difference retires that tokenizer for its
base model in this process (``gateway.tokenizer_mismatch`` log and metric), so the next requests are counted by the
engine again until the base model is registered with another ``tokenizer.json``. Until then a reservation can be off
by that difference; the bill is the engine's own count either way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from adapters_app.models import BaseModelTokenizer
from inference.gateway.directory import db_call

logger = logging.getLogger(__name__)

CHECK_FIRST = 16  # counts of a newly loaded tokenizer compared with the engine's
CHECK_EVERY = 256  # then one in this many
RECHECK_S = 60.0  # how often a process asks the database whether a base model's tokenizer changed
INLINE_MAX_CHARS = 2_048  # prompts up to this many characters in all are counted on the event loop

Stored = tuple[str | None, str | None]  # (sha256 or None when none is stored, tokenizer.json when it is new)


def stored_tokenizer(base_model_id: int, known_sha256: str | None) -> Stored:
    """The base model's stored tokenizer: ``(sha256, text)``; ``text`` is None when it is ``known_sha256`` (nothing
    to reload), ``(None, None)`` when none is stored. Database reads; run on the gateway's database thread."""
    sha = BaseModelTokenizer.objects.filter(pk=base_model_id).values_list("sha256", flat=True).first()
    if sha is None or sha == known_sha256:
        return sha, None
    text = BaseModelTokenizer.objects.filter(pk=base_model_id).values_list("tokenizer_json", flat=True).first()
    return sha, text


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
    loading: asyncio.Task[None] | None = None


class PromptCounter:
    """Per base model, the stored tokenizer of this process (loaded in the background on first need, looked up again
    every :data:`RECHECK_S`), and completion prompts' token counts with it.

    ``fetch`` reads what is stored (``stored_tokenizer`` through the gateway's database thread by default);
    ``clock`` is monotonic seconds. Both are parameters for tests.
    """

    def __init__(self, *, fetch: Callable[[int, str | None], Awaitable[Stored]] | None = None,
                 clock: Callable[[], float] = time.monotonic, recheck_s: float = RECHECK_S,
                 inline_max_chars: int = INLINE_MAX_CHARS) -> None:
        self._fetch = fetch or (lambda pk, sha: db_call(stored_tokenizer, pk, sha))
        self._clock = clock
        self._recheck_s = recheck_s
        self._inline_max_chars = inline_max_chars
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
            sha, text = await self._fetch(base_model_id, entry.sha256)
            if sha is None:
                entry.sha256, entry.tokenizer, entry.retired = None, None, False
            elif text is not None:
                tokenizer = await asyncio.to_thread(parse_tokenizer, text)
                entry.sha256, entry.tokenizer, entry.counted, entry.retired = sha, tokenizer, 0, False
                logger.info("gateway.tokenizer_loaded", extra={"base_model_id": base_model_id, "sha256": sha})
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

    def wants_check(self, base_model_id: int) -> bool:
        """Whether the count just made should be compared with the engine's: the first :data:`CHECK_FIRST` of a
        tokenizer, then one in :data:`CHECK_EVERY`."""
        entry = self._entries.get(base_model_id)
        if entry is None or entry.tokenizer is None or entry.retired:
            return False
        return entry.counted <= CHECK_FIRST or entry.counted % CHECK_EVERY == 0

    def checked(self, base_model_id: int, *, local: int, engine: int | None) -> bool:
        """Record the engine's count of a prompt this process counted ``local``; a difference retires the tokenizer
        (until the stored one changes). Returns whether they agreed (True when the engine gave no count)."""
        entry = self._entries.get(base_model_id)
        if engine is None or entry is None or local == engine:
            return True
        if not entry.retired:
            entry.retired = True
            logger.warning("gateway.tokenizer_mismatch", extra={
                "base_model_id": base_model_id, "sha256": entry.sha256, "local": local, "engine": engine})
        return False
