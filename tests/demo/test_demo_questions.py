"""The demo's printed usage counts its questions only: the gateway check before the uploads is one of them, not a
request of its own (``tiny-llama (base) requests=31`` after 30 questions). A unit test: a stand-in for the OpenAI
client records what the demo asks; the whole demo against the real stack is ``./scripts/demo --once``."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from openai import APIStatusError

from demo.run import ANSWER_TOKENS, _ask_examples, _first_answer

EXAMPLES = {"upper": [{"prompt": "abc:", "completion": " ABC"}, {"prompt": "xy:", "completion": " XY"}],
            "capitals": [{"prompt": "France:", "completion": " Paris"}, {"prompt": "Spain:", "completion": " Madrid"}]}


class RecordingClient:
    """``client.completions.create`` as the gateway would answer it: the expected completion for an adapter, noise
    for the base model; every call is recorded."""

    def __init__(self, refuse_with: int | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.refuse_with = refuse_with
        self.completions = SimpleNamespace(create=self._create)

    def _create(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        if self.refuse_with is not None:
            request = httpx.Request("POST", "http://gateway/v1/completions")
            response = httpx.Response(self.refuse_with, request=request, text='{"error": {"code": "no_capacity"}}')
            raise APIStatusError("refused", response=response, body=None)  # type: ignore[arg-type]
        expected = {ex["prompt"]: ex["completion"] for exs in EXAMPLES.values() for ex in exs}
        text = expected[kwargs["prompt"]] if kwargs["model"] != "tiny-llama" else " noise"
        return SimpleNamespace(choices=[SimpleNamespace(text=text)])


def test_the_first_answer_is_one_of_the_questions_so_each_model_is_asked_once_per_prompt(
        capsys: pytest.CaptureFixture[str]) -> None:
    client = RecordingClient()
    first = EXAMPLES[sorted(EXAMPLES)[0]][0]["prompt"]
    asked = _first_answer(client, "tiny-llama", first)  # type: ignore[arg-type]
    assert client.calls == [{"model": "tiny-llama", "prompt": "France:", "max_tokens": ANSWER_TOKENS,
                             "temperature": 0}]
    failures, total = _ask_examples(client, asked, EXAMPLES, "tiny-llama")  # type: ignore[arg-type]
    assert (failures, total) == (0, 4)
    # What the usage page then shows: as many base-model requests as questions, the early check among them.
    assert Counter(c["model"] for c in client.calls) == {"tiny-llama": 4, "upper": 2, "capitals": 2}
    assert sorted(c["prompt"] for c in client.calls if c["model"] == "tiny-llama") == sorted(
        ex["prompt"] for exs in EXAMPLES.values() for ex in exs)
    assert asked == {}  # the early answer was used, once
    table = capsys.readouterr().out
    assert "'France:'        ' Paris'       ' Paris'       ' noise'           yes" in table


def test_a_refused_first_answer_exits_with_the_gateways_status() -> None:
    with pytest.raises(SystemExit, match=r"first answer for tiny-llama was HTTP 503: .*no_capacity"):
        _first_answer(RecordingClient(refuse_with=503), "tiny-llama", "France:")  # type: ignore[arg-type]
