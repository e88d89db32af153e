"""Findings of the adapter validator and the exception that stops an upload.

Every check in this package reports a :class:`Problem`; nothing outside
``UploadRejected`` (intake) is raised for bad input, so one report can list
every problem at once (issue 3, "one report with every problem found").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

Severity = Literal["error", "warning"]

ERROR: Severity = "error"
WARNING: Severity = "warning"
_SEVERITIES = frozenset({ERROR, WARNING})


@dataclass(frozen=True)
class Problem:
    """One finding about an uploaded adapter.

    Attributes:
        code: Stable snake_case identifier clients may switch on, e.g.
            ``"pickle_weights"`` or ``"adapter_rank_too_high"``. Never reworded.
        severity: ``"error"`` (the adapter is refused) or ``"warning"``
            (accepted, but the tenant should know).
        field: The config key, file name or tensor name it concerns, e.g.
            ``"r"``, ``"adapter_model.safetensors"`` or
            ``"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"``;
            ``None`` when it concerns the upload as a whole.
        message: A human sentence naming the problem.
        hint: How to fix it.

    Raises:
        ValueError: On construction, if ``severity`` is not "error"/"warning"
            or ``code`` is empty (a programming error, not bad input).
    """

    code: str
    severity: str
    field: str | None
    message: str
    hint: str

    def __post_init__(self) -> None:
        if self.severity not in _SEVERITIES:
            raise ValueError(f"Problem.severity must be 'error' or 'warning', got {self.severity!r}")
        if not self.code:
            raise ValueError("Problem.code must be a non-empty snake_case string")

    @property
    def is_error(self) -> bool:
        """True when this finding refuses the adapter."""
        return self.severity == ERROR

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: ``{"code", "severity", "field", "message", "hint"}``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Problem:
        """Inverse of :meth:`to_dict` (used when a stored report is read back)."""
        return cls(
            code=d["code"], severity=d["severity"], field=d.get("field"), message=d["message"], hint=d["hint"]
        )


def error(code: str, field: str | None, message: str, hint: str) -> Problem:
    """Shorthand for an error-severity :class:`Problem`."""
    return Problem(code=code, severity=ERROR, field=field, message=message, hint=hint)


def warning(code: str, field: str | None, message: str, hint: str) -> Problem:
    """Shorthand for a warning-severity :class:`Problem`."""
    return Problem(code=code, severity=WARNING, field=field, message=message, hint=hint)


class UploadRejected(Exception):
    """Intake problems that stop an upload before anything is stored.

    Raised by :func:`iter_archive` and :func:`check_upload_names`.

    Attributes:
        problems: Every problem found, at least one, all of severity "error".
    """

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: list[Problem] = list(problems)
        if not self.problems:
            raise ValueError("UploadRejected needs at least one Problem")
        super().__init__("; ".join(f"{p.code}: {p.message}" for p in self.problems))

    @property
    def codes(self) -> list[str]:
        """The problems' codes, in order (handy for API envelopes and tests)."""
        return [p.code for p in self.problems]


def config_error(code: str, field: str | None, message: str, hint: str) -> Problem:
    """An error about ``adapter_config.json``: ``field`` is the config key, or None for the file as a whole."""
    return error(code, field if field is not None else "adapter_config.json", message, hint)
