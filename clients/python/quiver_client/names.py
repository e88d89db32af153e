"""The server's rule for adapter names, checked before anything is read or sent.

``quiver push --name "support bot"`` hashed every file (seconds to minutes for a large adapter) before the server
refused the name; the rule is the server's own (``tenants.models.slug_validator``): names are served as OpenAI
``model`` values and joined with ``--`` into engine names, hence no double hyphen.
"""

from __future__ import annotations

import re

from quiver_client.errors import EXIT_USAGE, QuiverError

ADAPTER_NAME_RE = re.compile(r"^(?=[a-z0-9-]{1,40}$)[a-z0-9]+(?:-[a-z0-9]+)*$")
ADAPTER_NAME_RULE = ("use 1-40 lowercase letters, digits or single hyphens, starting and ending with a letter or digit "
                     "(e.g. support-bot)")


def adapter_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an adapter's name, with the rule (one line), or None when it can."""
    if ADAPTER_NAME_RE.match(name):
        return None
    return f"{name!r} is not an adapter name: {ADAPTER_NAME_RULE}."


def check_adapter_name(name: str) -> str:
    """``name`` unchanged when it follows the server's rule.

    Raises:
        QuiverError: ``invalid_name`` (exit 2, a bad command line) naming the rule.
    """
    problem = adapter_name_problem(name)
    if problem is not None:
        raise QuiverError(problem, code="invalid_name", exit_code=EXIT_USAGE)
    return name
