"""Async HTTP client for one vLLM node engine (stock routes + `inference.node.engine_ext`)."""

from __future__ import annotations

from typing import Any

import httpx


class EngineError(Exception):
    """The engine answered with an error, or could not be reached.

    Attributes:
        status: HTTP status to pass on (503 when unreachable).
        code: machine-readable code (`engine_unavailable`, or the extension's code such as
            `engine_load_failed`, `lora_name_conflict`, `lora_int_id_conflict`, `lora_not_found`).
        detail: human-readable message.
    """

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


class EngineHTTPClient:
    """Talks to the engine with the node key.

    Args:
        http: an `httpx.AsyncClient` whose `base_url` is the engine URL (owned by the caller).
        api_key: the node key, sent as `Authorization: Bearer`.
    """

    def __init__(self, http: httpx.AsyncClient, api_key: str) -> None:
        self.http = http
        self._headers = {"Authorization": f"Bearer {api_key}"}

    async def _request(self, method: str, path: str, json: dict[str, Any] | None = None) -> httpx.Response:
        try:
            return await self.http.request(method, path, json=json, headers=self._headers)
        except httpx.HTTPError as exc:
            raise EngineError(503, "engine_unavailable", f"engine unreachable: {exc}") from exc

    async def _json(self, method: str, path: str, json: dict[str, Any] | None = None) -> dict[str, Any]:
        response = await self._request(method, path, json)
        try:
            body = response.json()
        except ValueError:
            body = {}
        if response.status_code >= 400:
            code = body.get("code") if isinstance(body, dict) else None
            detail = body.get("detail") if isinstance(body, dict) else None
            raise EngineError(
                response.status_code,
                str(code or "engine_error"),
                str(detail or response.text[:500]),
            )
        return body if isinstance(body, dict) else {}

    async def health(self) -> bool:
        """True when `GET /health` answers 200."""
        try:
            response = await self._request("GET", "/health")
        except EngineError:
            return False
        return response.status_code == 200

    async def add_lora(
        self, lora_name: str, lora_int_id: int, lora_path: str, *, pin: bool
    ) -> dict[str, Any]:
        """`POST /quiver/v1/add_lora`; returns the extension's JSON (see `engine_ext.add_lora`).

        Raises:
            EngineError: on any error answer or when unreachable.
        """
        body = {"lora_name": lora_name, "lora_int_id": lora_int_id, "lora_path": lora_path, "pin": pin}
        return await self._json("POST", "/quiver/v1/add_lora", body)

    async def remove_lora(self, lora_name: str) -> dict[str, Any]:
        """`POST /quiver/v1/remove_lora`; 404 `lora_not_found` raises EngineError."""
        return await self._json("POST", "/quiver/v1/remove_lora", {"lora_name": lora_name})

    async def evict_lora(self, lora_name: str) -> dict[str, Any]:
        """`POST /quiver/v1/evict_lora` (out of the CPU cache, name still served); 404 `lora_not_found` raises
        EngineError."""
        return await self._json("POST", "/quiver/v1/evict_lora", {"lora_name": lora_name})

    async def pin_lora(self, lora_name: str) -> dict[str, Any]:
        """`POST /quiver/v1/pin_lora`; 404 `lora_not_found` / 409 `pin_failed` raise EngineError."""
        return await self._json("POST", "/quiver/v1/pin_lora", {"lora_name": lora_name})

    async def set_eviction_policy(self, policy: str) -> dict[str, Any]:
        """`POST /quiver/v1/eviction_policy`; 400 `invalid_policy` / 503 `worker_extension_missing` raise
        EngineError."""
        return await self._json("POST", "/quiver/v1/eviction_policy", {"policy": policy})

    async def set_eviction_hints(self, *, over_quota: list[int], elsewhere: list[int], valid_s: float
                                 ) -> dict[str, Any]:
        """`POST /quiver/v1/eviction_hints`; 400 `invalid_request` / 503 `worker_extension_missing` raise
        EngineError."""
        return await self._json("POST", "/quiver/v1/eviction_hints",
                                {"over_quota": over_quota, "elsewhere": elsewhere, "valid_s": valid_s})

    async def loras_report(self) -> dict[str, Any]:
        """`GET /quiver/v1/loras` in full: `{"loras": [...], "engine_lora_int_ids", "residency"}`.

        Raises:
            EngineError: on any error answer or when unreachable.
        """
        return await self._json("GET", "/quiver/v1/loras")

    async def list_loras(self) -> list[dict[str, Any]]:
        """`GET /quiver/v1/loras` -> `[{"lora_name", "lora_int_id", "lora_path", "pinned", "in_engine"}]`."""
        body = await self._json("GET", "/quiver/v1/loras")
        return list(body.get("loras", []))

    async def complete_greedy(self, model: str, prompt: str, *, max_tokens: int) -> tuple[list[int], list[float]]:
        """`POST /v1/completions`, greedy (`temperature` 0, `ignore_eos`), with each chosen token's logprob.

        Returns:
            `(token_ids, logprobs)` of the generated tokens.

        Raises:
            EngineError: the engine refused or could not be reached.
        """
        body = await self._json("POST", "/v1/completions", {
            "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "logprobs": 1, "return_token_ids": True})
        try:
            choice = body["choices"][0]
            return [int(t) for t in choice["token_ids"]], [float(x) for x in choice["logprobs"]["token_logprobs"]]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EngineError(502, "engine_error", f"unexpected completion shape: {exc}") from exc

    async def metrics_text(self) -> str:
        """`GET /metrics` body (Prometheus text).

        Raises:
            EngineError: on a non-200 answer or when unreachable.
        """
        response = await self._request("GET", "/metrics")
        if response.status_code != 200:
            raise EngineError(
                response.status_code, "engine_error", f"metrics answered {response.status_code}"
            )
        return response.text
