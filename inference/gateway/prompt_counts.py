"""A request's prompt token counts for its tokens-per-minute reservation, and the one node allowed to see them.

Counted in this process where it can (:class:`~inference.gateway.prompt_counter.PromptCounter`: the base model's
tokenizer and chat template); otherwise by the engine of the node the request will be sent to first (vLLM's
``/tokenize``), which receives the prompt anyway. No other node is asked. The gateway used to ask whichever live node
of the base model looked least busy, for counts and for the counter's checks: a host holding a stolen node key,
reporting an idle engine, so received every tenant's prompts that needed counting, could answer a huge count (a 429
for every TPM-limited key on the base model) and, by disagreeing once, retired the local tokenizer for the process
(issue 30). Now an engine's count is capped at :func:`~inference.gateway.limits.prompt_token_bound` of the text (a
chat: of its JSON, or of its prompt as the stored chat template renders it when that is larger, plus
``CHAT_TEMPLATE_ROOM``; ``limits.prompt_token_counts``), and the counter's checks compare its
counts with the prompt counts the serving engine reports in the request's own usage (:func:`counts_check`), at the
request's end, with no round trip.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from inference.gateway.limits import prompt_token_counts
from inference.gateway.prompt_counter import PromptCounter
from inference.gateway.snapshot import NodeView, TargetView


@dataclass(frozen=True)
class Counted:
    """A request's prompt counts, in ``limits.prompt_token_estimates``' order.

    Attributes:
        counts: one token count per prompt.
        node: the node whose engine counted them, where the request must go first (None: counted here, or bounds).
        check: ``"prompt"`` or ``"chat"`` when this process counted them and the counter wants them compared with
            the serving engine's (:func:`counts_check`); ``""`` otherwise.
    """

    counts: list[int]
    node: NodeView | None = None
    check: str = ""


async def prompt_counts(upstream: dict[str, Any], target: TargetView, *, counter: PromptCounter,
                        serving_node: Callable[[], Awaitable[NodeView | None]], max_chars: int) -> Counted:
    """Each prompt's token count for ``upstream`` (the body after hygiene) to ``target``.

    A completion's text prompts, or a chat of plain text messages, at most ``max_chars`` characters each, are counted
    by ``counter`` once it holds the base model's tokenizer. Otherwise ``serving_node()`` (awaited only then) names
    the node the request will be sent to, and its engine counts them (capped); without one, or for a text longer than
    ``max_chars``, :func:`~inference.gateway.limits.prompt_token_bound` does (never below the real count).
    """
    texts = upstream.get("prompt")
    texts = [texts] if isinstance(texts, str) else texts
    chat = "messages" in upstream
    local = None
    if chat:
        if not upstream.get("tools") and sum(len(str(m.get("content"))) for m in upstream["messages"]
                                             if isinstance(m, dict)) <= max_chars:
            one = await counter.count_chat(target.base_model_id, upstream["messages"])
            local = None if one is None else [one]
    elif isinstance(texts, list) and texts and all(isinstance(t, str) and len(t) <= max_chars for t in texts):
        local = await counter.count(target.base_model_id, texts)
    if local is not None:
        wanted = counter.wants_check(target.base_model_id, chat=chat)
        return Counted(local, check=("chat" if chat else "prompt") if wanted else "")
    node = await serving_node()

    async def chat_bytes() -> int | None:
        size = len(str(upstream.get("messages"))) + len(str(upstream.get("tools") or ""))  # where to render it
        return await counter.chat_bytes(target.base_model_id, upstream.get("messages"), upstream.get("tools"),
                                        size=size)

    counts = await prompt_token_counts(upstream, engine_url=node.engine_url if node else None,
                                       node_key=node.key if node else "", model=target.base_model_name,
                                       max_chars=max_chars, chat_bytes=chat_bytes)
    return Counted(counts, node=node)


def counts_check(counter: PromptCounter, base_model_id: int, *, check: str, local: tuple[int, ...],
                 engine: Mapping[int, int], node: str) -> None:
    """Compare this process's prompt counts ``local`` (``check``: ``"prompt"``, ``"chat"``, or ``""`` for none)
    with ``engine``, the counts per prompt index that node ``node``'s engine reported while serving the request
    (``answers.UsageTally.prompts``); prompts it reported nothing for are skipped. Never raises."""
    if not check:
        return
    for index, count in sorted(engine.items()):
        if 0 <= index < len(local):
            counter.checked(base_model_id, local=local[index], engine=count, node=node, chat=check == "chat")
