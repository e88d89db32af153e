"""drf-spectacular: describe API-key auth as HTTP bearer in the OpenAPI schema (loaded from ``TenantsConfig.ready``)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """``Authorization: Bearer qv_<key_id>.<secret>``."""

    target_class = "tenants.authentication.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        """The OpenAPI security scheme."""
        return {"type": "http", "scheme": "bearer", "bearerFormat": "qv_<key_id>.<secret>"}
