"""DRF's JSON parser, hardened: JSON nested past Python's recursion limit is a 400 ``parse_error``, not a 500.

``json.loads`` raises ``RecursionError`` (not ``ValueError``) for a few thousand nested ``[``; DRF's parser only turns
``ValueError`` into ``ParseError``, so ``[[[[…]]]]`` under 4 MiB crashed every JSON endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError


class JSONParser(parsers.JSONParser):
    """``rest_framework.parsers.JSONParser`` that refuses over-deep JSON with ``ParseError`` (400)."""

    def parse(self, stream: IO[Any], media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        """Parse like DRF; raises ``ParseError`` for malformed or too deeply nested JSON."""
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError("JSON parse error - nested too deeply; send a flat JSON object.") from exc
