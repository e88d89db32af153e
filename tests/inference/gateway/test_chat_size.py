"""A chat's rendered size (``PromptCounter.chat_bytes``), the billing cap of a chat whose template writes more than
the request holds (``inference.gateway.exchange.usage_bounded``): never below the engine's token count, for
templates that render tools in several ways (indented JSON after a preamble, compact JSON in tags, a line per
tool), chats of every role, content parts and dense text. The engine's count is transformers' own render and
tokenization of the chat (what vLLM runs), with the tools as vLLM hands them to the template (its own tool model's
dump). The database read of the stored files is a stand-in (``Store``): a unit test of the sizing alone."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam

from adapters_app.chat_template import template_inputs
from demo.tiny_model import CHAT_TEMPLATE
from inference.gateway.prompt_counter import PromptCounter
from tests.inference.gateway.test_chat_counter import DENSE, Store, _loaded

TEMPLATES = {
    "demo": CHAT_TEMPLATE,
    "tags": ("{% if tools %}<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>\n{% endif %}"
             "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
             "{% if add_generation_prompt %}<|assistant|>{% endif %}"),
    "lines": ("{{ bos_token }}{% for tool in tools or [] %}- {{ tool['function']['name'] }}: "
              "{{ tool['function']['description'] or 'no description' }} {{ tool['function']['parameters'] | tojson }}"
              "\n{% endfor %}{% for message in messages %}[{{ message['role'] | upper }}] {{ message['content'] }}"
              "{% endfor %}"),
}


def _schema(rnd: random.Random, depth: int) -> dict[str, Any]:
    if depth == 0:
        return {"type": rnd.choice(["string", "integer"]), "description": "".join(rnd.choice(DENSE) for _ in range(6))}
    return {"type": "object", "properties": {f"p{i}": _schema(rnd, depth - 1) for i in range(rnd.randint(1, 2))}}


def _request(rnd: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A chat and its tools as a client sends them (fields left out, text in parts)."""
    tools: list[dict[str, Any]] = []
    for i in range(rnd.randint(1, 3)):
        function: dict[str, Any] = {"name": f"tool_{i}"}
        if rnd.random() < 0.5:
            function["description"] = "".join(rnd.choice(DENSE) for _ in range(rnd.randint(0, 30)))
        if rnd.random() < 0.7:
            function["parameters"] = _schema(rnd, rnd.randint(0, 4))
        if rnd.random() < 0.3:
            function["strict"] = rnd.random() < 0.5
        tool: dict[str, Any] = {"type": "function", "function": function}
        if rnd.random() < 0.3:
            tool["defer_loading"] = rnd.random() < 0.5
        tools.append(tool)
    messages: list[dict[str, Any]] = []
    for role in rnd.sample(["system", "user", "assistant", "tool", "user"], k=rnd.randint(1, 5)):
        text = "".join(rnd.choice(DENSE) for _ in range(rnd.randint(0, 40)))
        content: Any = [{"type": "text", "text": text}, {"type": "text", "text": "x"}] if rnd.random() < 0.3 else text
        messages.append({"role": role, "content": content})
    return messages, tools


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_rendered_size_is_never_below_the_engines_count(tiny_base_dir: Path, name: str) -> None:
    engine = AutoTokenizer.from_pretrained(str(tiny_base_dir))
    rnd = random.Random(3)
    requests = [_request(rnd) for _ in range(60)]

    async def run() -> list[int | None]:
        counter = PromptCounter(fetch=Store((tiny_base_dir / "tokenizer.json").read_text(), TEMPLATES[name]).fetch,
                                inline_max_chars=400)  # the longer chats render in a worker thread
        await _loaded(counter)
        return [await counter.chat_bytes(1, messages, tools, size=len(str(messages)) + len(str(tools)))
                for messages, tools in requests]

    sizes = asyncio.run(run())
    counts = []
    for messages, tools in requests:
        rendered_messages, rendered_tools = template_inputs(messages, tools)
        vllm_tools = [ChatCompletionToolsParam.model_validate(t).model_dump() for t in tools]  # what vLLM renders
        assert rendered_tools == vllm_tools
        counts.append(len(engine.apply_chat_template(rendered_messages, tools=vllm_tools, chat_template=TEMPLATES[name],
                                                     add_generation_prompt=True, tokenize=True, return_dict=False)))
    assert all(size is not None and size >= count for size, count in zip(sizes, counts, strict=True)), \
        [(s, c) for s, c in zip(sizes, counts, strict=True) if s is None or s < c]
    # Tight enough that a lying engine gains little: a few bytes a token at most on this tokenizer.
    assert sum(s or 0 for s in sizes) <= 4 * sum(counts)


def test_no_template_or_one_that_refuses_the_chat_gives_no_size(tiny_base_dir: Path) -> None:
    text = (tiny_base_dir / "tokenizer.json").read_text()
    refusing = "{% if tools %}{{ raise_exception('no tools here') }}{% endif %}x"
    chat = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f"}}]

    async def run() -> tuple[int | None, int | None, int | None]:
        bare = PromptCounter(fetch=Store(text, "").fetch)
        strict = PromptCounter(fetch=Store(text, refusing).fetch)
        # Not loaded beforehand: the first call waits for the load it starts.
        return (await bare.chat_bytes(1, chat, tools, size=10), await strict.chat_bytes(1, chat, tools, size=10),
                await strict.chat_bytes(1, chat, None, size=10))

    assert asyncio.run(run()) == (None, None, 1)
