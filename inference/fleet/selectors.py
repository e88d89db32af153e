"""Reads of the fleet for the operator's pages: per-node residency and failure counts, the residency map by version.

Both are bounded by the caller's page (a list of node ids, a page of versions): the operator pages no longer read
every placement of the fleet in one call (docs/scale-usage.md, "Operator pages at 64 nodes").
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from django.db.models import Count, Exists, OuterRef, Prefetch, Q, QuerySet

from adapters_app.models import AdapterVersion
from inference.fleet.models import Placement
from inference.metering.models import UsageRecord

TIERS = tuple(t.value for t in Placement.Tier)


def node_residency_counts(*, node_ids: Collection[int]) -> dict[int, dict[str, Any]]:
    """Per node in ``node_ids``: how many placements sit in each tier and how many are pinned (one grouped query).

    Returns:
        ``{node_id: {"tiers": {tier: count, every tier present}, "pinned": int}}``; a node without placements maps
        to zeros; ids not asked for are absent.
    """
    counts: dict[int, dict[str, Any]] = {pk: {"tiers": dict.fromkeys(TIERS, 0), "pinned": 0} for pk in node_ids}
    rows = (Placement.objects.filter(node_id__in=list(node_ids)).values("node_id", "tier")
            .annotate(n=Count("id"), pinned=Count("id", filter=Q(pinned=True))).order_by())
    for row in rows:
        summary = counts[row["node_id"]]
        summary["tiers"][row["tier"]] = summary["tiers"].get(row["tier"], 0) + row["n"]
        summary["pinned"] += row["pinned"]
    return counts


def node_failures(*, node_ids: Collection[int], since: datetime) -> dict[int, int]:
    """Per node in ``node_ids``: requests it answered with status >= 500 since ``since`` (an aware datetime; a
    caller's own 4xx is not the node's failure), from the gateway's usage records; one grouped query.

    Returns:
        ``{node_id: count}``, 0 for a node without a failure; ids not asked for are absent.
    """
    counts = dict.fromkeys(node_ids, 0)
    rows = (UsageRecord.objects.filter(node_id__in=list(node_ids), created_at__gte=since, status_code__gte=500)
            .values("node_id").annotate(n=Count("id")).order_by())
    for row in rows:
        counts[row["node_id"]] = row["n"]
    return counts


def residency_map_versions(*, tenant_slug: str | None = None) -> QuerySet[AdapterVersion]:
    """Adapter versions placed on at least one node (of one tenant, by slug, when given), ordered as the map shows
    them (tenant slug, adapter name, newest version first), each with ``map_placements``: its placements with
    their node, by node name. Page it before evaluating: the prefetch then reads only the page's placements.
    """
    placed = Placement.objects.filter(adapter_version=OuterRef("pk"))
    versions = AdapterVersion.objects.filter(Exists(placed))
    if tenant_slug:
        versions = versions.filter(adapter__tenant__slug=tenant_slug)
    return (versions.select_related("adapter__tenant")
            .only("id", "number", "size_bytes", "adapter__name", "adapter__tenant__slug")
            .prefetch_related(Prefetch("placements", to_attr="map_placements",
                                       queryset=Placement.objects.select_related("node").only(
                                           "id", "adapter_version_id", "tier", "pinned", "served", "load_ms",
                                           "last_error", "updated_at", "node__name").order_by("node__name")))
            .order_by("adapter__tenant__slug", "adapter__name", "-number", "id"))
