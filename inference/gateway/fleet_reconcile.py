"""The reconcile loop: converge what nodes report (``Placement``) toward what is wanted (``inference.fleet.placement``
over live nodes, recent request rates and operators' ``VersionIntent``), through the existing warm tasks.

Idempotent and crash-safe: it reads only committed rows and asks for warms through ``placement_request_warm``, which
skips a version that is resident or already warming; running it twice, or after a control-plane restart, enqueues
nothing new for a converged fleet. It adds replicas and pins; it does not evict (the engines' LRUs and the agent's
eviction make room on demand, and an operator can evict now through the API).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import timedelta

from django.db.models import Count, Q
from django.utils import timezone

from adapters_app.models import AdapterVersion
from inference.fleet.placement import Demand, PlacementNode, place
from inference.gateway.models import Placement, UsageRecord, VersionIntent
from inference.gateway.placement import RESIDENT, nodes_live, placement_request_warm

logger = logging.getLogger(__name__)
RATE_WINDOW_S = 600


def fleet_reconcile() -> int:
    """One pass over every base model with live nodes; returns how many warms it asked for."""
    asked = 0
    versions = {
        v.pk: v for v in AdapterVersion.objects.filter(status=AdapterVersion.Status.READY)
        .select_related("adapter__base_model", "adapter__tenant").order_by("adapter_id", "-number")
    }
    newest: dict[int, AdapterVersion] = {}
    for v in versions.values():  # the gateway serves each adapter's newest ready version
        if v.adapter_id not in newest or v.number > newest[v.adapter_id].number:
            newest[v.adapter_id] = v
    since = timezone.now() - timedelta(seconds=RATE_WINDOW_S)
    counts = dict(UsageRecord.objects.filter(created_at__gte=since, adapter_version__isnull=False)
                  .values_list("adapter_version").annotate(n=Count("id")).values_list("adapter_version", "n"))
    intents = {i.adapter_version_id: i for i in VersionIntent.objects.all()}
    held: dict[int, set[str]] = defaultdict(set)
    for version_id, node_name in Placement.objects.filter(Q(tier__in=RESIDENT) | Q(served=True)).values_list(
            "adapter_version_id", "node__name"):
        held[version_id].add(node_name)
    by_base: dict[int, list[AdapterVersion]] = defaultdict(list)
    for v in newest.values():
        by_base[v.adapter.base_model_id].append(v)
    for base_id, base_versions in by_base.items():
        live = list(nodes_live(base_versions[0].adapter.base_model))
        if not live:
            continue
        nodes = [PlacementNode(n.name, str(base_id), n.max_lora_rank, max(n.max_cpu_loras, 1)) for n in live]
        demands = []
        for v in base_versions:
            intent = intents.get(v.pk)
            pinned = frozenset(intent.pinned_nodes) if intent else frozenset()
            if intent and intent.pinned_fleet:
                pinned |= frozenset(held[v.pk])
            demands.append(Demand(v.pk, str(base_id), v.r or 0, v.size_bytes, counts.get(v.pk, 0) / RATE_WINDOW_S,
                                  min_replicas=intent.min_replicas if intent else 1,
                                  max_replicas=intent.max_replicas if intent else None,
                                  pinned_nodes=pinned, resident_on=frozenset(held[v.pk])))
        plan = place(demands, nodes)
        node_by_name = {n.name: n for n in live}
        for d in demands:
            for name in plan.get(d.version_id, ()):
                if name in held[d.version_id] and name not in d.pinned_nodes:
                    continue
                if name in d.pinned_nodes:
                    Placement.objects.get_or_create(node=node_by_name[name], adapter_version=versions[d.version_id])
                    Placement.objects.filter(node=node_by_name[name], adapter_version_id=d.version_id).update(
                        pinned=True)
                    if name in held[d.version_id]:
                        continue
                placement_request_warm(versions[d.version_id], node=node_by_name[name])
                asked += 1
    logger.info("fleet.reconciled", extra={"warms": asked})
    return asked
