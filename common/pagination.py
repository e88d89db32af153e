"""Bounded pages for list endpoints whose length grows with the fleet (nodes, placements): DRF's
``LimitOffsetPagination``, ``?limit=&offset=``, answered as DRF's page shape ``{"count", "next", "previous",
"results"}`` (``next``/``previous``: absolute URLs or null).

Lists that stay small per tenant (adapters, keys, members) are answered whole, as plain arrays; a list that grows
with the number of nodes or adapter versions on the platform is paged so that one call's cost is bounded (the
operator's nodes page, unpaged, cost 740 ms of web CPU at 64 nodes and 5,800 placements: docs/scale-usage.md).
"""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination


class BoundedPage(LimitOffsetPagination):
    """``limit`` defaults to :attr:`default_limit` and is capped at :attr:`max_limit` (a larger one is served as the
    cap, not refused: DRF's behaviour); ``offset`` past the end is an empty ``results`` with the true ``count``. A
    non-integer or negative ``limit``/``offset`` falls back to the default / 0 (DRF's behaviour)."""

    default_limit = 50
    max_limit = 200
