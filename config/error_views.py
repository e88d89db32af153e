"""JSON error pages for errors raised outside DRF (URL misses, Django's request limits, crashes).

``/v1/*`` answers in OpenAI's ``{"error": {...}}`` shape; everything else in the control plane's ``{"detail", "code"}``.
"""

from __future__ import annotations

from django.core.exceptions import DisallowedHost, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import HttpRequest, JsonResponse
from django.http.multipartparser import MultiPartParserError


def _error(request: HttpRequest, status: int, code: str, message: str) -> JsonResponse:
    if request.path.startswith("/v1/"):
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return JsonResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status=status)
    return JsonResponse({"detail": message, "code": code}, status=status)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    """``handler400``: Django refused the request before any view ran.

    Each cause gets its own code and message: a ``Host`` outside ``ALLOWED_HOSTS`` (``disallowed_host``), the
    ``DATA_UPLOAD_MAX_*`` limits (``request_too_large``, ``too_many_fields``, ``too_many_files``), a malformed
    multipart body (``bad_multipart``), anything else (``bad_request``). One message for all of them used to blame
    the body's size for a wrong ``Host``, so a misconfigured proxy or DNS name looked like an upload problem.
    """
    code, message = _bad_request_reason(request, exception)
    return _error(request, 400, code, message)


def _bad_request_reason(request: HttpRequest, exception: Exception | None) -> tuple[str, str]:
    if isinstance(exception, DisallowedHost):
        # request.get_host() would raise again; the raw header is echoed clipped, never trusted.
        host = str(request.META.get("HTTP_HOST", ""))[:100]
        return "disallowed_host", (f"Host '{host}' is not served here; use the address this service is published "
                                   "under, or ask an operator to add it to DJANGO_ALLOWED_HOSTS.")
    if isinstance(exception, RequestDataTooBig):
        return "request_too_large", ("The request body is over DATA_UPLOAD_MAX_MEMORY_SIZE; send a smaller body "
                                     "(uploads go as multipart files).")
    if isinstance(exception, TooManyFieldsSent):
        return "too_many_fields", "The request has more fields than DATA_UPLOAD_MAX_NUMBER_FIELDS; send fewer."
    if isinstance(exception, TooManyFilesSent):
        return "too_many_files", "The request has more files than DATA_UPLOAD_MAX_NUMBER_FILES; send fewer."
    if isinstance(exception, MultiPartParserError):
        return "bad_multipart", "The multipart body could not be parsed; send well-formed multipart/form-data."
    return "bad_request", "The request was refused before reaching the API; check its headers and body."


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
