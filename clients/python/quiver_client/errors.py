"""The client's errors and the command's exit codes.

Every error the client raises is a :class:`QuiverError`: a one-line message that names the problem and the fix,
and the exit code the ``quiver`` command ends with. Messages never carry an API key or a presigned URL.
"""

from __future__ import annotations

from typing import Any

#: Exit codes of the ``quiver`` command, stable for CI jobs to branch on.
EXIT_OK = 0
EXIT_ERROR = 1  # the command could not be done: network, key, permission, not found, server error
EXIT_USAGE = 2  # bad command line (argparse's own code)
EXIT_REJECTED = 3  # the adapter failed validation, locally (before any upload) or on the server
EXIT_UPLOAD_FAILED = 4  # the server refused the uploaded bytes (sha256 or size mismatch, upload closed)
EXIT_TIMEOUT = 5  # still validating when --timeout ran out (rerun the command to keep waiting)
EXIT_INTERRUPTED = 130  # Ctrl-C; a push resumes when the same command is run again


class QuiverError(Exception):
    """A user-facing failure: ``str(err)`` is one line naming the problem and the fix.

    Attributes:
        code: A stable snake_case code: the server's ``code`` for API errors, the client's own otherwise
            (``not_configured``, ``unreachable``, ``local_validation_failed``...).
        exit_code: What the ``quiver`` command exits with (see the ``EXIT_*`` constants).
    """

    def __init__(self, message: str, *, code: str = "error", exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code


class ApiError(QuiverError):
    """The server answered with an error: ``{"detail", "code"[, "fields"]}`` (or OpenAI's ``{"error": {…}}``).

    Attributes:
        status: The HTTP status.
        fields: Per-field messages when the server gave them, else ``{}``.
    """

    def __init__(self, message: str, *, status: int, code: str, fields: dict[str, Any] | None = None) -> None:
        super().__init__(message, code=code)
        self.status = status
        self.fields = fields or {}


class ValidationFailed(QuiverError):
    """The adapter has errors: found locally before any upload, or by the server's validation.

    Attributes:
        report: The validation report, ``{"ok": False, "problems": [{code, severity, field, message, hint}], ...}``.
        where: ``"local"`` or ``"server"``.
    """

    def __init__(self, message: str, *, report: dict[str, Any], where: str) -> None:
        super().__init__(message, code="local_validation_failed" if where == "local" else "adapter_rejected",
                         exit_code=EXIT_REJECTED)
        self.report = report
        self.where = where
