"""JSON error pages for errors raised outside DRF (URL misses, Django's request limits, crashes).

``/v1/*`` answers in OpenAI's ``{"error": {...}}`` shape; everything else in the control plane's ``{"detail", "code"}``.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse


def _error(request: HttpRequest, status: int, code: str, message: str) -> JsonResponse:
    if request.path.startswith("/v1/"):
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return JsonResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status=status)
    return JsonResponse({"detail": message, "code": code}, status=status)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    """``handler400``: Django refused the request (``DATA_UPLOAD_MAX_*`` limits, bad multipart)."""
    return _error(request, 400, "bad_request",
                  "The request was refused before reaching the API (too many files or fields, or a body over the "
                  "size limit); send fewer or smaller parts.")


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    """``handler403`` outside DRF."""
    return _error(request, 403, "permission_denied", "You do not have permission to perform this action.")


def not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    """``handler404``: no route matched (e.g. an adapter name with capitals in the URL)."""
    return _error(request, 404, "not_found",
                  f"No route for {request.path}. Adapter names are 1-40 lowercase letters, digits or hyphens.")


def server_error(request: HttpRequest) -> JsonResponse:
    """``handler500``: an unhandled exception (logged by Django)."""
    return _error(request, 500, "server_error", "Internal error; it has been logged.")


def csrf_failure(request: HttpRequest, reason: str = "") -> JsonResponse:
    """``CSRF_FAILURE_VIEW``: a console call without the ``X-CSRFToken`` header matching the ``csrftoken`` cookie."""
    return _error(request, 403, "csrf_failed",
                  f"CSRF check failed ({reason}); send the csrftoken cookie's value as the X-CSRFToken header.")
