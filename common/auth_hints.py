"""What to send when credentials are missing or wrong: one wording for every 401 of the control plane, the front
door and the gateway, each naming the header in the form the server mints keys (``qv_<id>.<secret>``).

Fresh-user round (issue 30): DRF's "Authentication credentials were not provided." and "Use 'Authorization: Bearer
<api key>'." left people guessing the key's form and where to get one.
"""

from __future__ import annotations

from django.conf import settings

WHERE_KEYS_COME_FROM = "create one on the console's API keys page or with `quiver keys create`"


def bearer_header() -> str:
    """The header to send, as a template: ``Authorization: Bearer qv_<id>.<secret>`` (the configured key prefix)."""
    return f"Authorization: Bearer {settings.QUIVER_API_KEY_PREFIX}_<id>.<secret>"


def missing_credentials() -> str:
    """The 401 text for a request with neither an ``Authorization`` header nor a signed-in console session."""
    return (f"No credentials: send `{bearer_header()}` (an API key: {WHERE_KEYS_COME_FROM}), or sign in to the "
            "console (a session that ended needs a new sign-in).")


def malformed_header() -> str:
    """The 401 text for an ``Authorization`` header that is not ``Bearer <token>`` (Basic, a bare key, empty)."""
    return f"The Authorization header is not a bearer API key: send `{bearer_header()}`."


def invalid_key() -> str:
    """The 401 text for a bearer token that is no live key (unknown, malformed, revoked or expired)."""
    return f"Invalid, revoked or expired API key: send a current one as `{bearer_header()}` ({WHERE_KEYS_COME_FROM})."


def missing_key() -> str:
    """The 401 text for a gateway (``/v1/``) request without a bearer API key (the gateway takes no sessions)."""
    return f"No API key: send `{bearer_header()}` ({WHERE_KEYS_COME_FROM})."
