"""The effect probe: does a freshly loaded adapter change the base model's output at all?

A fixed prompt, a few greedy tokens, each chosen token's logprob compared with the base model's (issue 6 §5).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from inference.node.cache import FileSpec
from inference.node.config import NodeSettings
from inference.node.engine_client import EngineError, EngineHTTPClient

logger = logging.getLogger(__name__)

PROBE_PROMPT = "The quick brown fox jumps over the lazy dog and"
PROBE_TOKENS = 4
# An adapter that adds exact zeros leaves fp32 logprobs bit-identical; batching noise stays far below this.
PROBE_TOLERANCE = 1e-4


class EffectProbe:
    """Probes adapters against the base model, and remembers verdicts by weights.

    Args:
        settings: node settings (``base_model``, ``effect_probe``).
        engine: HTTP client for the engine.
    """

    def __init__(self, settings: NodeSettings, engine: EngineHTTPClient) -> None:
        self.settings = settings
        self.engine = engine
        self._base_probe: tuple[list[int], list[float]] | None = None
        # Effect probe verdicts by weights (the files' sha256s, sorted): the same weights on the same base (this
        # agent serves one) always give the same verdict, so a reload after an eviction skips the probe's two
        # greedy requests. `unknown` (the probe failed) is not kept.
        self._verdicts: dict[tuple[str, ...], str] = {}

    async def verdict(self, lora_name: str, files: Sequence[FileSpec]) -> str:
        """The effect verdict for the weights in ``files``: the cached one when this agent already probed the same
        weights (a reload after an eviction), else ``probe``'s (`unchecked` with the probe off)."""
        if not self.settings.effect_probe:
            return "unchecked"
        weights = tuple(sorted(f.sha256 for f in files))
        verdict = self._verdicts.get(weights)
        if verdict is None:
            verdict = await self.probe(lora_name)
            if verdict != "unknown":
                self._verdicts[weights] = verdict
        return verdict

    async def probe(self, lora_name: str) -> str:
        """Does the adapter change the output? ``PROBE_TOKENS`` greedy tokens on ``PROBE_PROMPT``, with and without it.

        Returns:
            `changed` (other tokens, or some chosen token's logprob differs by more than ``PROBE_TOLERANCE``),
            `no_effect` (identical: the adapter adds nothing, e.g. every lora_B is zero or its weights cancel, the
            `vllm#34186` class of silent no-ops), or `unknown` (the engine did not answer the probe). The base
            model's answer is asked once per agent process.
        """
        try:
            if self._base_probe is None:
                self._base_probe = await self.engine.complete_greedy(self.settings.base_model, PROBE_PROMPT,
                                                                     max_tokens=PROBE_TOKENS)
            ids, logprobs = await self.engine.complete_greedy(lora_name, PROBE_PROMPT, max_tokens=PROBE_TOKENS)
        except EngineError as exc:
            logger.warning("agent.probe_failed", extra={"lora_name": lora_name, "error": exc.detail})
            return "unknown"
        base_ids, base_logprobs = self._base_probe
        if ids != base_ids or len(logprobs) != len(base_logprobs):
            return "changed"
        delta = max((abs(a - b) for a, b in zip(logprobs, base_logprobs, strict=True)), default=0.0)
        return "changed" if delta > PROBE_TOLERANCE else "no_effect"
