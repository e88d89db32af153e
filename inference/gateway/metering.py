"""Usage metering: one row per proxied request, with the engine's own token counts (``usage``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inference.gateway.models import Node, UsageRecord
from inference.gateway.routing import Target
from tenants.models import ApiKey


def usage_record_create(
    *, api_key: ApiKey, target: Target, node: Node | None, endpoint: str, stream: bool, status_code: int,
    usage: Mapping[str, Any] | None, latency_ms: float,
) -> UsageRecord:
    """Record one request. ``usage`` is OpenAI's ``{"prompt_tokens", "completion_tokens", ...}`` or None (errors)."""
    usage = usage or {}
    return UsageRecord.objects.create(
        tenant_id=api_key.tenant_id, api_key=api_key, adapter_version=target.version, base_model=target.base_model,
        node=node, model_name=target.requested, version_number=target.version.number if target.version else None,
        endpoint=endpoint, stream=stream, status_code=status_code,
        prompt_tokens=int(usage.get("prompt_tokens") or 0), completion_tokens=int(usage.get("completion_tokens") or 0),
        latency_ms=latency_ms,
    )
