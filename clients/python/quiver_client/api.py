"""A thin typed client of Quiver's control-plane API (``/api/v1/``) and OpenAI-compatible gateway (``/v1/``).

Each method is one request; answers are the API's JSON as documented at ``/api/v1/schema``. Errors become
:class:`~quiver_client.errors.ApiError` (the server's ``detail`` and ``code``) or
:class:`~quiver_client.errors.QuiverError` (the server could not be reached), each one line with its fix.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from quiver_client.config import Settings, resolve
from quiver_client.errors import ApiError, QuiverError

USER_AGENT = "quiver-client/0.1"
_RETRY_STATUS = frozenset({502, 503, 504})


def _name(value: str) -> str:
    return quote(value, safe="")


class Client:
    """One Quiver server and tenant key.

    Args:
        url: Base URL of the web service (``QUIVER_URL``); None resolves flags/environment/config file.
        api_key: ``qv_<id>.<secret>`` (``QUIVER_API_KEY``); None resolves as ``url``.
        timeout: Seconds per request (uploads' part PUTs have their own, see :mod:`quiver_client.upload`).
        transport: An httpx transport for the API requests (tests, proxies); None for the default.

    Raises:
        QuiverError: ``not_configured`` when no URL or key is found.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, url: str | None = None, api_key: str | None = None, *, timeout: float = 60.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.settings: Settings = resolve(url=url, api_key=api_key)
        self.url = self.settings.url
        self._http = httpx.Client(base_url=self.url, timeout=timeout, transport=transport, headers={
            "Authorization": f"Bearer {self.settings.api_key}", "User-Agent": USER_AGENT})

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    # -- plumbing ------------------------------------------------------------------------------------------------

    def request(self, method: str, path: str, *, json_body: Any = None, params: Mapping[str, Any] | None = None,
                stream: bool = False) -> httpx.Response:
        """Send one request; idempotent ones (GET) are retried twice on 502/503/504 or a refused connection.

        Returns:
            The response (status < 400). With ``stream``, the body is not read: close the response.

        Raises:
            ApiError: the server answered >= 400 (``detail`` and ``code`` from its error envelope).
            QuiverError: ``unreachable`` or ``timeout``.
        """
        attempts = 3 if method == "GET" else 1
        for attempt in range(attempts):
            try:
                req = self._http.build_request(method, path, json=json_body, params=params)
                resp = self._http.send(req, stream=stream)
            except httpx.TimeoutException as exc:
                raise QuiverError(f"Quiver at {self.url} did not answer {method} {path} in time; retry, or pass a "
                                  "longer --timeout.", code="timeout") from exc
            except httpx.TransportError as exc:
                if attempt + 1 < attempts:
                    time.sleep(0.5 * 2**attempt)
                    continue
                raise QuiverError(f"Cannot reach Quiver at {self.url} ({type(exc).__name__}); check --url or "
                                  "QUIVER_URL and that the server is up.", code="unreachable") from exc
            if resp.status_code in _RETRY_STATUS and attempt + 1 < attempts:
                resp.close()
                time.sleep(0.5 * 2**attempt)
                continue
            if resp.status_code >= 400:
                if stream:
                    resp.read()
                raise self._error(resp)
            return resp
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _error(self, resp: httpx.Response) -> ApiError:
        try:
            body = resp.json()
        except ValueError:
            body = None
        status = resp.status_code
        if isinstance(body, dict) and isinstance(body.get("error"), dict):  # the gateway's OpenAI shape
            err = body["error"]
            detail, code, fields = str(err.get("message") or ""), str(err.get("code") or err.get("type") or ""), None
        elif isinstance(body, dict) and "detail" in body:
            detail, code, fields = str(body["detail"]), str(body.get("code") or ""), body.get("fields")
        else:
            hint = ("check that --url/QUIVER_URL is the Quiver web service's base URL" if status == 404
                    else "retry shortly; if it persists, ask the operator to check the server's logs")
            return ApiError(f"Quiver at {self.url} answered HTTP {status} to {resp.request.method} "
                            f"{resp.request.url.path} without an API error body; {hint}.", status=status,
                            code=f"http_{status}")
        detail = " ".join(detail.split())
        if status == 401:
            detail = (f"{detail.rstrip('.')}: the API key {self.settings.masked_key} was refused; run `quiver login` "
                      "or set QUIVER_API_KEY to a valid key.")
        elif status == 403 and code in ("permission_denied", "scope_missing", "insufficient_scope", ""):
            detail = f"{detail.rstrip('.')}. Use a key with the scope this needs (`quiver keys create --scope ...`)."
        elif status >= 500 and status != 503:
            detail = f"{detail.rstrip('.')} (HTTP {status}); retry shortly, or ask the operator to check the logs."
        return ApiError(detail, status=status, code=code or f"http_{status}", fields=fields)

    def get(self, path: str, **params: Any) -> Any:
        """``GET path`` → its JSON (None-valued params are left out)."""
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None}).json()

    def post(self, path: str, body: Any = None) -> Any:
        """``POST path`` with a JSON body → its JSON (None for an empty body)."""
        resp = self.request("POST", path, json_body=body)
        return resp.json() if resp.content else None

    # -- registry --------------------------------------------------------------------------------------------------

    def adapters(self) -> list[dict[str, Any]]:
        """``GET /api/v1/adapters``: the tenant's adapters (name, base_model, latest_version, serving_version…)."""
        return list(self.get("/api/v1/adapters"))

    def adapter(self, name: str) -> dict[str, Any]:
        """``GET /api/v1/adapters/{name}``. Raises ApiError 404 when the tenant has no such adapter."""
        return dict(self.get(f"/api/v1/adapters/{_name(name)}"))

    def adapter_delete(self, name: str) -> None:
        """``DELETE /api/v1/adapters/{name}``: the adapter, its versions and stored files (owner role/scope)."""
        self.request("DELETE", f"/api/v1/adapters/{_name(name)}")

    def versions(self, name: str) -> list[dict[str, Any]]:
        """``GET /api/v1/adapters/{name}/versions``: newest first, each with status and validation report."""
        return list(self.get(f"/api/v1/adapters/{_name(name)}/versions"))

    def version(self, name: str, number: int) -> dict[str, Any]:
        """``GET /api/v1/adapters/{name}/versions/{number}``: one version with its validation report."""
        return dict(self.get(f"/api/v1/adapters/{_name(name)}/versions/{int(number)}"))

    def base_models(self) -> list[dict[str, Any]]:
        """``GET /api/v1/base-models``: name, architecture, pool limits (and ``facts`` where the server gives them)."""
        return list(self.get("/api/v1/base-models"))

    # -- serving rules (docs/versions.md) ---------------------------------------------------------------------

    def serving(self, name: str) -> dict[str, Any]:
        """``GET /api/v1/adapters/{name}/serving``: the rule (``[{version, weight}]``), the rule a rollback returns
        to, ``auto_promote``, the adapter's limits and the latest changes."""
        return dict(self.get(f"/api/v1/adapters/{_name(name)}/serving"))

    def promote(self, name: str, version: int) -> dict[str, Any]:
        """``POST /api/v1/adapters/{name}/promote``: all traffic to ``version``, warmed first; the answer has each
        joining version's ``warm`` state and ``serving_since``. ApiError 400 ``serving_rule_invalid`` when not
        ready."""
        return dict(self.post(f"/api/v1/adapters/{_name(name)}/promote", {"version": int(version)}))

    def canary(self, name: str, version: int, percent: int) -> dict[str, Any]:
        """``POST /api/v1/adapters/{name}/canary``: ``percent`` % (0..100) to ``version``, the rest to the current
        primary (sticky per OpenAI ``user``); 0 ends the canary."""
        return dict(self.post(f"/api/v1/adapters/{_name(name)}/canary",
                              {"version": int(version), "percent": int(percent)}))

    def rollback(self, name: str) -> dict[str, Any]:
        """``POST /api/v1/adapters/{name}/rollback``: back to the rule before the last change. ApiError 409
        ``nothing_to_roll_back``."""
        return dict(self.post(f"/api/v1/adapters/{_name(name)}/rollback"))

    # -- keys and usage ------------------------------------------------------------------------------------------

    def keys(self) -> list[dict[str, Any]]:
        """``GET /api/v1/api-keys``: the keys the caller may see (masked; never a secret)."""
        return list(self.get("/api/v1/api-keys"))

    def key_create(self, name: str, *, scopes: Sequence[str] | None = None,
                   expires_at: str | None = None, adapters: Sequence[str] | None = None) -> dict[str, Any]:
        """``POST /api/v1/api-keys``: a new key; its ``secret`` is in this answer only. ``adapters`` scopes it at
        the gateway (adapter names or ``name@N``; other models are a 404)."""
        body: dict[str, Any] = {"name": name}
        if scopes:
            body["scopes"] = list(scopes)
        if adapters:
            body["adapters"] = list(adapters)
        if expires_at:
            body["expires_at"] = expires_at
        return dict(self.post("/api/v1/api-keys", body))

    def key_revoke(self, key_id: str) -> dict[str, Any]:
        """``POST /api/v1/api-keys/{key_id}/revoke`` (idempotent)."""
        return dict(self.post(f"/api/v1/api-keys/{_name(key_id)}/revoke"))

    def usage(self, *, since: str | None = None, until: str | None = None) -> list[dict[str, Any]]:
        """``GET /api/v1/usage``: requests and tokens per model and version in the range (ISO 8601 bounds)."""
        return list(self.get("/api/v1/usage", since=since, until=until))

    def usage_csv(self, *, since: str | None = None, until: str | None = None) -> Iterator[bytes]:
        """``GET /api/v1/usage?export=csv``: the raw records as CSV, streamed in chunks."""
        params = {k: v for k, v in {"since": since, "until": until, "export": "csv"}.items() if v}
        resp = self.request("GET", "/api/v1/usage", params=params, stream=True)
        try:
            yield from resp.iter_bytes()
        finally:
            resp.close()

    # -- gateway -------------------------------------------------------------------------------------------------

    def chat(self, model: str, prompt: str, *, max_tokens: int = 128, temperature: float = 0.0,
             system: str | None = None) -> dict[str, Any]:
        """``POST /v1/chat/completions`` (not streamed): the OpenAI-shaped answer."""
        return dict(self.post("/v1/chat/completions", self._chat_body(model, prompt, max_tokens, temperature,
                                                                      system, stream=False)))

    def chat_stream(self, model: str, prompt: str, *, max_tokens: int = 128, temperature: float = 0.0,
                    system: str | None = None) -> Iterator[str]:
        """``POST /v1/chat/completions`` streamed: yields the answer's text as it arrives (server-sent events)."""
        body = self._chat_body(model, prompt, max_tokens, temperature, system, stream=True)
        resp = self.request("POST", "/v1/chat/completions", json_body=body, stream=True)
        try:
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if isinstance(event.get("error"), dict):
                    raise ApiError(str(event["error"].get("message")), status=resp.status_code,
                                   code=str(event["error"].get("code") or "stream_error"))
                for choice in event.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        yield text
        finally:
            resp.close()

    @staticmethod
    def _chat_body(model: str, prompt: str, max_tokens: int, temperature: float, system: str | None,
                   *, stream: bool) -> dict[str, Any]:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature,
                "stream": stream}

    # -- direct uploads (adapters_app.direct_upload on the server) ---------------------------------------------

    def upload_create(self, name: str, *, files: Sequence[Mapping[str, Any]],
                      base_model: str | None = None) -> dict[str, Any]:
        """``POST /api/v1/adapters/{name}/uploads``: declare ``[{name, size, sha256}]``; the answer has the upload
        ``id``, ``part_size``, each file's ``parts`` and ``part_urls`` (the first 100 per file)."""
        return dict(self.post(f"/api/v1/adapters/{_name(name)}/uploads",
                              {"files": list(files), "base_model": base_model or ""}))

    def upload(self, name: str, upload_id: str) -> dict[str, Any]:
        """``GET .../uploads/{id}``: ``state`` (open, verifying, done, failed, aborted), ``version`` once done."""
        return dict(self.get(f"/api/v1/adapters/{_name(name)}/uploads/{_name(upload_id)}"))

    def upload_parts(self, name: str, upload_id: str) -> list[dict[str, Any]]:
        """``GET .../uploads/{id}/parts``: the parts S3 already holds, ``[{name, PartNumber, ETag, Size}]``."""
        return list(self.get(f"/api/v1/adapters/{_name(name)}/uploads/{_name(upload_id)}/parts"))

    def upload_sign(self, name: str, upload_id: str, *, file: str, part_numbers: Sequence[int]) -> dict[int, str]:
        """``POST .../uploads/{id}/sign``: presigned PUT URLs of up to 100 parts of one file, by part number."""
        body = self.post(f"/api/v1/adapters/{_name(name)}/uploads/{_name(upload_id)}/sign",
                         {"name": file, "part_numbers": list(part_numbers)})
        return {int(n): str(u) for n, u in body["urls"].items()}

    def upload_complete(self, name: str, upload_id: str, *, file: str) -> dict[str, Any]:
        """``POST .../uploads/{id}/complete``: the server completes one file from S3's own part listing."""
        return dict(self.post(f"/api/v1/adapters/{_name(name)}/uploads/{_name(upload_id)}/complete", {"name": file}))

    def push(self, path: str | Path, *, name: str, base_model: str | None = None, **options: Any) -> Any:
        """Validate, upload and (by default) wait for ``path``: see :func:`quiver_client.upload.push`."""
        from quiver_client.upload import push

        return push(self, Path(path), name=name, base_model=base_model, **options)
