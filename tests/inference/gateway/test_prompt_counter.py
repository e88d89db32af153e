"""The gateway's own tokenizer (``inference.gateway.prompt_counter``): counts as the engine's tokenizer does, loads in
the background, reloads only a changed file, and retires itself when the engine disagrees."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from adapters_app.models import tokenizer_files_sha256
from inference.gateway import prompt_counter
from inference.gateway.prompt_counter import (
    CHECK_EVERY,
    CHECK_FIRST,
    PromptCounter,
    TokenizerFiles,
    parse_tokenizer,
)

DENSE_ALPHABET = "abc ~~é中😀\n\t<s></s>  xyz123!?"


@pytest.fixture(scope="module")
def tokenizer_json(tiny_base_dir: Path) -> str:
    return (tiny_base_dir / "tokenizer.json").read_text()


class Store:
    """What the database holds for base model 1, and how often it was asked."""

    def __init__(self, text: str | None, template: str = "", tokens: dict[str, str] | None = None) -> None:
        self.text = text
        self.template = template
        self.tokens = tokens or {}
        self.asked: list[str | None] = []
        self.fail = False

    async def fetch(self, pk: int, known: str | None) -> tuple[str | None, TokenizerFiles | None]:
        self.asked.append(known)
        if self.fail:
            raise ConnectionError("database down")
        if self.text is None:
            return None, None
        sha = tokenizer_files_sha256(self.text, self.template, self.tokens)
        return sha, (None if sha == known else TokenizerFiles(self.text, self.template, dict(self.tokens)))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _loaded(counter: PromptCounter, pk: int = 1) -> None:
    """Ask once (which starts the load) and wait until the load finished."""
    counter.ready(pk)
    entry = counter._entries[pk]
    while entry.loading is not None:
        await asyncio.sleep(0.001)


def test_counts_equal_the_engines_tokenizer_on_dense_text(tiny_base_dir: Path, tokenizer_json: str) -> None:
    """The engine counts with transformers' tokenizer for the model folder (vLLM's ``get_tokenizer``); the gateway's
    counts of random dense text, short (on the loop) and long (in a thread), are the same."""
    engine = AutoTokenizer.from_pretrained(str(tiny_base_dir))
    rnd = random.Random(7)
    short = ["".join(rnd.choice(DENSE_ALPHABET) for _ in range(rnd.randint(0, 60))) for _ in range(300)]
    long = ["".join(rnd.choice(DENSE_ALPHABET) for _ in range(3_000)) for _ in range(3)]

    async def run() -> tuple[list[int] | None, list[int] | None, list[int] | None]:
        counter = PromptCounter(fetch=Store(tokenizer_json).fetch)
        before = await counter.count(1, ["x"])
        await _loaded(counter)
        return before, await counter.count(1, short), await counter.count(1, long)

    before, short_counts, long_counts = asyncio.run(run())
    assert before is None  # not loaded yet: the caller asks the engine
    assert short_counts == [len(engine.encode(t, add_special_tokens=True)) for t in short]
    assert long_counts == [len(engine.encode(t, add_special_tokens=True)) for t in long]
    assert short_counts[0] >= 1  # the BOS the engine adds is counted


def test_a_saved_truncation_does_not_cut_the_count(tokenizer_json: str) -> None:
    """vLLM refuses a prompt over the context instead of truncating it, so a truncation saved in the file must not
    make the count short."""
    saved = Tokenizer.from_str(tokenizer_json)
    saved.enable_truncation(max_length=8)
    assert len(saved.encode("~" * 100)) == 8
    assert len(parse_tokenizer(saved.to_str()).encode("~" * 100)) > 8


def test_no_stored_tokenizer_means_the_engine_counts_and_a_later_registration_is_picked_up(
        tokenizer_json: str) -> None:
    store, clock = Store(None), Clock()

    async def run() -> tuple[list[int] | None, list[int] | None]:
        counter = PromptCounter(fetch=store.fetch, clock=clock, recheck_s=60)
        await _loaded(counter)
        none = await counter.count(1, ["abc"])
        store.text = tokenizer_json  # registered with its tokenizer while the gateway runs
        clock.now = 59
        await _loaded(counter)  # not due: no look
        clock.now = 60
        await _loaded(counter)
        return none, await counter.count(1, ["abc"])

    none, counted = asyncio.run(run())
    assert none is None and counted is not None and counted[0] > 1
    assert len(store.asked) == 2  # once at start, once when the recheck was due


def test_an_unchanged_file_is_not_read_again_and_a_failed_look_keeps_the_tokenizer(tokenizer_json: str) -> None:
    store, clock = Store(tokenizer_json), Clock()

    async def run() -> list[int] | None:
        counter = PromptCounter(fetch=store.fetch, clock=clock, recheck_s=1)
        await _loaded(counter)
        clock.now = 1
        await _loaded(counter)
        store.fail = True
        clock.now = 2
        await _loaded(counter)
        return await counter.count(1, ["abc"])

    assert asyncio.run(run()) is not None
    sha = hashlib.sha256(tokenizer_json.encode()).hexdigest()
    assert store.asked == [None, sha, sha]  # the second and third looks sent the known digest: no text came back


def test_checks_the_first_counts_then_one_in_every(tokenizer_json: str) -> None:
    async def run() -> list[bool]:
        counter = PromptCounter(fetch=Store(tokenizer_json).fetch)
        await _loaded(counter)
        wanted = []
        for _ in range(2 * CHECK_EVERY):
            await counter.count(1, ["abc"])
            wanted.append(counter.wants_check(1))
        return wanted

    wanted = asyncio.run(run())
    assert wanted[:CHECK_FIRST] == [True] * CHECK_FIRST
    assert [i + 1 for i, w in enumerate(wanted) if w][CHECK_FIRST:] == [CHECK_EVERY, 2 * CHECK_EVERY]


def test_disagreement_from_two_nodes_retires_the_tokenizer_until_the_file_changes(
        tokenizer_json: str, caplog: pytest.LogCaptureFixture) -> None:
    store, clock = Store(tokenizer_json), Clock()

    async def run() -> tuple[list[int] | None, list[int] | None, bool]:
        counter = PromptCounter(fetch=store.fetch, clock=clock, recheck_s=1)
        await _loaded(counter)
        local = await counter.count(1, ["abc"])
        assert local is not None
        agreed = (counter.checked(1, local=local[0], engine=local[0], node="a")
                  and counter.checked(1, local=local[0], engine=None, node="a"))
        assert agreed
        for _ in range(3):  # one node's word, however often, retires nothing (a rogue node did, issue 30)
            assert not counter.checked(1, local=local[0], engine=local[0] + 1, node="a")
        assert await counter.count(1, ["abc"]) == local
        assert not counter.checked(1, local=local[0], engine=local[0] + 1, node="b")  # a second node agrees with it
        retired = await counter.count(1, ["abc"])
        clock.now = 1
        await _loaded(counter)  # same file: still retired
        same = counter.ready(1) is None
        store.text = json.dumps({**json.loads(tokenizer_json), "normalizer": None})  # re-registered, another file
        clock.now = 2
        await _loaded(counter)
        return retired, await counter.count(1, ["abc"]), same

    with caplog.at_level("WARNING", logger=prompt_counter.__name__):
        retired, again, same = asyncio.run(run())
    assert retired is None and same and again is not None
    mismatches = [r for r in caplog.records if r.message == "gateway.tokenizer_mismatch"]
    assert [(r.node, r.retired) for r in mismatches] == [("a", False), ("b", True)]  # type: ignore[attr-defined]


def test_counts_are_checked_against_the_serving_engines_usage_and_one_node_cannot_retire_them(
        tokenizer_json: str) -> None:
    """The checks compare each prompt's local count with the count the serving engine put in the request's own
    usage (``UsageTally.prompts``), per prompt index; a rogue node disagreeing on every request it serves leaves
    the tokenizer in use (issue 30), while a second node's disagreement retires it."""
    from inference.gateway.prompt_counts import counts_check

    async def run() -> tuple[bool, bool]:
        counter = PromptCounter(fetch=Store(tokenizer_json).fetch)
        await _loaded(counter)
        local = await counter.count(1, ["abc", "de"])
        assert local is not None
        for _ in range(50):
            counts_check(counter, 1, check="prompt", local=tuple(local), engine={0: local[0], 1: 10**9, 7: 1},
                         node="rogue")
        counts_check(counter, 1, check="", local=tuple(local), engine={0: 0}, node="other")  # nothing to check
        kept = counter.ready(1) is not None
        counts_check(counter, 1, check="prompt", local=tuple(local), engine={1: local[1] + 1}, node="other")
        return kept, counter.ready(1) is None

    assert asyncio.run(run()) == (True, True)
