"""The unstreamed answer the gateway builds from the engine's chunks keeps what vLLM's own unstreamed answer has."""

from __future__ import annotations

from inference.gateway.answers import assemble_answer


def test_completion_token_ids_are_joined_per_choice_and_prompt_ids_kept() -> None:
    chunks = [
        {"id": "c", "created": 1, "model": "m", "choices": [
            {"index": 0, "text": "a", "token_ids": [5], "prompt_token_ids": [1, 2]},
            {"index": 1, "text": "x", "token_ids": [9], "prompt_token_ids": [1, 2]}]},
        {"id": "c", "choices": [{"index": 0, "text": "b", "token_ids": [6, 7], "finish_reason": "length"},
                                {"index": 1, "text": "y", "token_ids": [8], "finish_reason": "stop"}]},
    ]
    answer = assemble_answer("completions", chunks, {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9})
    first, second = answer["choices"]
    assert (first["text"], first["token_ids"], first["prompt_token_ids"]) == ("ab", [5, 6, 7], [1, 2])
    assert (second["text"], second["token_ids"], second["finish_reason"]) == ("xy", [9, 8], "stop")


def test_chat_prompt_token_ids_sit_on_the_answer_and_absent_fields_stay_absent() -> None:
    chunks = [{"id": "c", "prompt_token_ids": [3, 4], "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": "hi"}, "token_ids": [11]}]},
        {"id": "c", "choices": [{"index": 0, "delta": {"content": "!"}, "token_ids": [12], "finish_reason": "stop"}]}]
    answer = assemble_answer("chat/completions", chunks, None)
    assert answer["prompt_token_ids"] == [3, 4]
    assert answer["choices"][0]["message"]["content"] == "hi!"
    assert answer["choices"][0]["token_ids"] == [11, 12]
    plain = assemble_answer("completions", [{"choices": [{"index": 0, "text": "a"}]}], None)
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain
