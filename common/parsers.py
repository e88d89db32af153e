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


class FormParser(parsers.FormParser):
    """``rest_framework.parsers.FormParser`` that refuses a JSON body sent as a form.

    ``curl -d '{"version": 2}'`` without ``-H 'Content-Type: application/json'`` sends
    ``application/x-www-form-urlencoded``, which parses as one field named after the whole JSON text, and the view
    then answered "version: This field is required." about a body that held it (fresh-user round, issue 30).
    """

    def parse(self, stream: IO[Any], media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        """Parse like DRF; raises ``ParseError`` (400) when the only field's name opens like JSON (``{`` or ``[``)."""
        data = super().parse(stream, media_type, parser_context)
        keys = list(data.keys())
        if len(keys) == 1 and keys[0].lstrip()[:1] in ("{", "["):
            raise ParseError("This body is JSON sent as a form (Content-Type: application/x-www-form-urlencoded, "
                             "what `curl -d` sends by default): add `-H 'Content-Type: application/json'`.")
        return data
