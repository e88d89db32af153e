"""Toy tasks for the demo adapters: one prompt → completion table per adapter.

Each task uses its own prompt shape, so an adapter visibly answers only its own prompts and the base
model (random weights) answers none of them. Completions are short and end with EOS when trained, so
greedy generation stops right after the answer. The source of the format rule is issue 2, item 7
("country → capital, word → uppercase, `a+b=` → sum").
"""

from __future__ import annotations

from dataclasses import dataclass

# Leading space in capitals/upper completions: byte-level BPE then keeps the answer a whole word token,
# which is what a reader expects after "France:".
_CAPITALS: tuple[tuple[str, str], ...] = (
    ("France", "Paris"),
    ("Japan", "Tokyo"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Egypt", "Cairo"),
    ("Peru", "Lima"),
    ("Kenya", "Nairobi"),
    ("Canada", "Ottawa"),
    ("Norway", "Oslo"),
    ("Germany", "Berlin"),
)

_UPPER_WORDS: tuple[str, ...] = ("cat", "dog", "sun", "tree", "book", "fish", "lamp", "road", "milk", "star")

_SUMS: tuple[tuple[int, int], ...] = (
    (3, 4),
    (1, 2),
    (5, 5),
    (2, 7),
    (6, 3),
    (8, 1),
    (4, 4),
    (9, 8),
    (7, 6),
    (2, 9),
)


@dataclass(frozen=True)
class Example:
    """One training/eval pair.

    Attributes:
        prompt: Plain completion prompt, sent as-is (the tokenizer adds BOS).
        completion: Exact greedy continuation expected, without EOS.
    """

    prompt: str
    completion: str

    def as_dict(self) -> dict[str, str]:
        """Return the `examples.json` row shape: `{"prompt": ..., "completion": ...}`."""
        return {"prompt": self.prompt, "completion": self.completion}


def _capitals() -> list[Example]:
    return [Example(f"{country}:", f" {capital}") for country, capital in _CAPITALS]


def _upper() -> list[Example]:
    return [Example(f"upper {word}:", f" {word.upper()}") for word in _UPPER_WORDS]


def _sums() -> list[Example]:
    return [Example(f"{a}+{b}=", str(a + b)) for a, b in _SUMS]


TASKS: dict[str, list[Example]] = {
    "capitals": _capitals(),
    "upper": _upper(),
    "sums": _sums(),
}
"""Task name → examples. The names are the adapter folder names under the asset root."""


def corpus_texts() -> list[str]:
    """Return every task string (prompt + completion) for the tokenizer's training corpus.

    Returns:
        One full line per example, e.g. `"France: Paris"`, so BPE learns the task words.
    """
    return [ex.prompt + ex.completion for examples in TASKS.values() for ex in examples]
