"""Chats counted in the gateway (``inference.gateway.prompt_counter`` with ``adapters_app.chat_template``): the same
count as transformers' ``apply_chat_template`` (what vLLM's chat route runs) for plain text chats under several
templates; every other chat goes to the engine; chats are checked and retired apart from prompts."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from adapters_app.models import tokenizer_files_sha256
from inference.gateway import prompt_counter
from inference.gateway.prompt_counter import CHECK_FIRST, PromptCounter, TokenizerFiles

DENSE = "abc ~~é中😀\n\t<s></s>  xyz123!?{}%"
TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
# The demo model's, a Llama 3 style one (role headers, a system message first, raise_exception on a bad role) and a
# ChatML style one (loop controls, tojson, trim_blocks/lstrip_blocks whitespace).
TEMPLATES = {
    "demo": "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}",
    "llama3": (
        "{{ bos_token }}{% for message in messages %}{% if message['role'] not in ['system', 'user', 'assistant'] %}"
        "{{ raise_exception('bad role') }}{% endif %}{{ '<s>' + message['role'] + '\\n\\n' + message['content'] | trim"
        " + eos_token }}{% endfor %}{% if add_generation_prompt %}{{ '<s>assistant\\n\\n' }}{% endif %}"),
    "chatml": (
        "{% for message in messages %}\n"
        "  {% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou help.<|im_end|>\n{% endif %}\n"
        "  {% if message['content'] == '' %}{% continue %}{% endif %}\n"
        "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}{{ {'n': loop.index} | tojson }}<|im_end|>\n"
        "{% endfor %}\n{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
}


class Store:
    def __init__(self, text: str, template: str) -> None:
        self.text, self.template = text, template

    async def fetch(self, pk: int, known: str | None) -> tuple[str | None, TokenizerFiles | None]:
        sha = tokenizer_files_sha256(self.text, self.template, TOKENS)
        return sha, (None if sha == known else TokenizerFiles(self.text, self.template, dict(TOKENS)))


async def _loaded(counter: PromptCounter, pk: int = 1) -> None:
    counter.ready(pk)
    while counter._entries[pk].loading is not None:
        await asyncio.sleep(0.001)


def _chat(rnd: random.Random, turns: int, size: int) -> list[dict[str, str]]:
    roles = ["system"] if rnd.random() < 0.5 else []
    roles += ["user", "assistant"] * turns
    return [{"role": r, "content": "".join(rnd.choice(DENSE) for _ in range(rnd.randint(0, size)))}
            for r in roles[:rnd.randint(1, len(roles))]]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_plain_chats_count_as_transformers_renders_and_tokenizes_them(tiny_base_dir: Path, name: str) -> None:
    """Short chats (counted on the loop) and long ones (in a thread) alike."""
    engine = AutoTokenizer.from_pretrained(str(tiny_base_dir))
    template = TEMPLATES[name]
    rnd = random.Random(11)
    chats = [_chat(rnd, 3, 40) for _ in range(80)] + [_chat(rnd, 2, 3_000) for _ in range(3)]

    async def run() -> list[int | None]:
        counter = PromptCounter(fetch=Store((tiny_base_dir / "tokenizer.json").read_text(), template).fetch)
        await _loaded(counter)
        return [await counter.count_chat(1, chat) for chat in chats]

    counts = asyncio.run(run())
    expected = [len(engine.apply_chat_template(chat, chat_template=template, add_generation_prompt=True,
                                               tokenize=True, return_dict=False)) for chat in chats]
    assert counts == expected


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],  # content parts: vLLM may join or pass them
    [{"role": "user", "content": "hi", "name": "ann"}],
    [{"role": "developer", "content": "hi"}],  # vLLM rewrites it for templates without the role
    [{"role": "tool", "content": "1", "tool_call_id": "x"}],
    [{"role": "assistant", "content": None}],
    [],
    "hi",
])
def test_other_chats_are_left_to_the_engine(tiny_base_dir: Path, messages: Any) -> None:
    async def run() -> int | None:
        counter = PromptCounter(fetch=Store((tiny_base_dir / "tokenizer.json").read_text(), TEMPLATES["demo"]).fetch)
        await _loaded(counter)
        assert await counter.count_chat(1, [{"role": "user", "content": "hi"}]) is not None
        return await counter.count_chat(1, messages)

    assert asyncio.run(run()) is None


def test_no_template_or_a_refusing_one_leaves_the_chat_to_the_engine(tiny_base_dir: Path) -> None:
    text = (tiny_base_dir / "tokenizer.json").read_text()
    refusing = "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('user first') }}{% endif %}x"

    async def run() -> tuple[int | None, int | None, int | None]:
        bare = PromptCounter(fetch=Store(text, "").fetch)
        await _loaded(bare)
        strict = PromptCounter(fetch=Store(text, refusing).fetch)
        await _loaded(strict)
        return (await bare.count_chat(1, [{"role": "user", "content": "hi"}]),
                await strict.count_chat(1, [{"role": "assistant", "content": "hi"}]),
                await strict.count_chat(1, [{"role": "user", "content": "hi"}]))

    no_template, refused, plain = asyncio.run(run())
    assert (no_template, refused) == (None, None)
    assert plain == 1  # "x" alone, no special tokens added


def test_chats_are_checked_and_retired_apart_from_prompts(tiny_base_dir: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A template the engine renders otherwise (an engine started with its own ``--chat-template``) must not stop
    the gateway counting completion prompts, which the template does not touch."""
    chat = [{"role": "user", "content": "hello"}]

    async def run() -> tuple[list[bool], int | None, list[int] | None, bool]:
        counter = PromptCounter(fetch=Store((tiny_base_dir / "tokenizer.json").read_text(), TEMPLATES["demo"]).fetch)
        await _loaded(counter)
        await counter.count(1, ["abc"])  # prompts count apart: the chat's first checks are still due
        wanted = []
        for _ in range(CHECK_FIRST + 1):
            await counter.count_chat(1, chat)
            wanted.append(counter.wants_check(1, chat=True))
        local = await counter.count_chat(1, chat)
        assert local is not None
        assert not counter.checked(1, local=local, engine=local + 2, chat=True, node="a")
        assert await counter.count_chat(1, chat) == local  # one node's word retires nothing
        assert not counter.checked(1, local=local, engine=local + 2, chat=True, node="b")
        return wanted, await counter.count_chat(1, chat), await counter.count(1, ["abc"]), counter.ready(1) is not None

    with caplog.at_level("WARNING", logger=prompt_counter.__name__):
        wanted, retired, prompts, prompt_check = asyncio.run(run())
    assert wanted == [True] * CHECK_FIRST + [False]
    assert retired is None and prompts is not None and prompt_check
    mismatches = [r for r in caplog.records if r.message == "gateway.tokenizer_mismatch"]
    assert len(mismatches) == 2 and all(getattr(m, "chat", None) is True for m in mismatches)
