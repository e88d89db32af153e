"""The fleet's state: nodes, where each adapter version lives on them (observed), what operators want (intent),
tenants' residency quotas, the audit log of operator actions, and node gauges over time.

Residency is control-plane state recorded from our own warm/evict actions and node heartbeats, since engine metrics
show activity, not residency (vllm-project/vllm#45325). The tables keep the names they had when these models lived in
the ``gateway`` app (``db_table``), so a running deployment upgrades without a table rename (docs/architecture.md).

Change stamps: ``change_xid`` on nodes and placements is the 64-bit id (PostgreSQL ``xid8``) of the transaction that
last inserted or updated the row, set by a trigger (migration ``fleet.0003``) so that ``QuerySet.update``,
``bulk_update`` and raw SQL stamp it as ``save()`` does (``updated_at`` is set by ``save()`` only). A deleted row
leaves a :class:`FleetGone` record stamped the same way. Each gateway process keeps a copy of the fleet and reads
only the rows stamped since its last read (``inference.gateway.fleet_reader``). Null on SQLite (no trigger; that
reader re-reads everything there).
"""

from __future__ import annotations

from django.db import models

from adapters_app.models import AdapterVersion, BaseModel
from tenants.models import Tenant


class Node(models.Model):
    """One inference node: a vLLM engine serving ``base_model`` plus Quiver's node agent.

    Registered by an operator with its URLs and capacity ceilings; gauges come from its authenticated heartbeats.
    ``max_loras`` / ``max_cpu_loras`` / ``max_lora_rank`` are the figures placement and routing use: the heartbeat's,
    clamped to the ceilings (``inference.policy.node_capacity``; what the node reported stays in ``state``).
    ``kv_cache_usage_perc`` is vLLM's ``vllm:kv_cache_usage_perc`` gauge, 0..1.
    """

    name = models.CharField(max_length=100, unique=True)
    base_model = models.ForeignKey(BaseModel, null=True, on_delete=models.SET_NULL, related_name="nodes")
    # Set by an operator at registration (inference.fleet.nodes.node_register), never by a heartbeat.
    agent_url = models.URLField(max_length=300)
    engine_url = models.URLField(max_length=300)
    # Generation of the node's derived credentials (inference.fleet.node_keys); +1 revokes the old pair.
    key_generation = models.PositiveIntegerField(default=1)
    registered_at = models.DateTimeField(null=True)
    # Set by deregistration: the row stays so that registering the name again moves to a new key generation
    # (a deleted row would restart at generation 1 and revive the old credentials).
    deregistered_at = models.DateTimeField(null=True, blank=True)
    healthy = models.BooleanField(default=False)
    last_heartbeat_at = models.DateTimeField(null=True)
    max_loras = models.PositiveIntegerField(default=0)
    max_cpu_loras = models.PositiveIntegerField(default=0)
    max_lora_rank = models.PositiveIntegerField(default=0)
    # Set by an operator at registration (quiver_node_register --max-loras ...), never by a heartbeat; null = the
    # fleet's default (QUIVER_NODE_MAX_LORAS_CEILING, QUIVER_NODE_MAX_CPU_LORAS_CEILING, the base model's rank).
    max_loras_ceiling = models.PositiveIntegerField(null=True, blank=True)
    max_cpu_loras_ceiling = models.PositiveIntegerField(null=True, blank=True)
    max_lora_rank_ceiling = models.PositiveIntegerField(null=True, blank=True)
    kv_cache_usage_perc = models.FloatField(null=True)
    num_requests_running = models.IntegerField(null=True)
    num_requests_waiting = models.IntegerField(null=True)
    state = models.JSONField(default=dict)
    # Digest of the last heartbeat's residency and of the placement rows it settled (inference.policy.node_report):
    # a heartbeat that gives the same one changes no placement row, so it skips that work. "" = decide again.
    residency_digest = models.CharField(max_length=64, blank=True, default="")
    # Set by a PostgreSQL trigger on every write (migration fleet.0003), whatever wrote it: see the module docstring.
    change_xid = models.BigIntegerField(null=True, editable=False)

    class Meta:
        db_table = "gateway_node"

    def __str__(self) -> str:
        return self.name


class Placement(models.Model):
    """Where an adapter version lives on a node: ``cold | staged | warm | hot | errored`` plus ``pinned``.

    ``pinned`` is an operator's pin (``VersionIntent``) carried to this row, never the node's word: a node's report
    or load answer cannot mark a row pinned, which would keep it from being trimmed (attack round). What the engine
    says it pinned is kept in ``Node.state`` (the reconciler's repin check reads it there).

    ``warming_since`` marks an in-flight warm so concurrent gateway requests enqueue it once; ``load_issued_at``
    records that the control plane asked this node to load the version, which a heartbeat needs to record it.
    """

    class Tier(models.TextChoices):
        COLD = "cold"
        STAGED = "staged"
        WARM = "warm"
        HOT = "hot"
        ERRORED = "errored"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="placements")
    adapter_version = models.ForeignKey(AdapterVersion, on_delete=models.CASCADE, related_name="placements")
    tier = models.CharField(max_length=8, choices=Tier.choices, default=Tier.COLD)
    pinned = models.BooleanField(default=False)
    # The engine answers for the name, even when its LRU dropped the weights to disk (tier "staged"): requests
    # work at the cost of a disk reload, so the gateway can route there without a warm round trip.
    served = models.BooleanField(default=False)
    warming_since = models.DateTimeField(null=True, blank=True)
    # When the control plane first queued or sent a load of this version to this node (a warm, a pin). A heartbeat's
    # claim that the node holds the version counts only after it (``placement.node_heartbeat``): a node holding a
    # valid token could otherwise make itself a route for any version of its base model, other tenants' included.
    load_issued_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    load_ms = models.FloatField(null=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Set by a PostgreSQL trigger on every write (migration fleet.0003), whatever wrote it: see the module docstring.
    change_xid = models.BigIntegerField(null=True, editable=False)

    class Meta:
        db_table = "gateway_placement"
        constraints = [models.UniqueConstraint(fields=["node", "adapter_version"], name="placement_unique")]
        indexes = [models.Index(fields=["change_xid"], name="placement_change_xid")]

    def __str__(self) -> str:
        return f"{self.adapter_version_id}@{self.node_id}:{self.tier}"


class VersionIntent(models.Model):
    """Desired state for one adapter version, set by operators; heartbeats never write it (observed state lives in
    ``Placement``). ``pinned_nodes`` is a list of node names; ``pinned_fleet`` pins it on every node that holds it.
    """

    adapter_version = models.OneToOneField(AdapterVersion, on_delete=models.CASCADE, related_name="intent")
    min_replicas = models.PositiveSmallIntegerField(default=1)
    max_replicas = models.PositiveSmallIntegerField(null=True, blank=True)
    pinned_fleet = models.BooleanField(default=False)
    pinned_nodes = models.JSONField(default=list, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "gateway_versionintent"

    def __str__(self) -> str:
        return f"intent:{self.adapter_version_id}"


class TenantResidencyQuota(models.Model):
    """A tenant's share of the fleet: at most ``max_pinned`` pinned versions and ``max_gpu_bytes`` of GPU slots
    (rank-padded bytes, ``inference.policy.eviction.gpu_slot_bytes``); null = no limit. Over it, the tenant's own
    adapters are evicted first (``inference.policy.eviction``)."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="residency_quota")
    max_pinned = models.PositiveIntegerField(null=True, blank=True)
    max_gpu_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "gateway_tenantresidencyquota"

    def __str__(self) -> str:
        return f"quota:{self.tenant_id}"


class FleetAuditRecord(models.Model):
    """One operator action on the fleet: who, what, on which object, when, and the state before → after."""

    actor = models.CharField(max_length=200)
    action = models.CharField(max_length=40)
    target = models.CharField(max_length=300)
    before = models.JSONField(default=dict)
    after = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        db_table = "gateway_fleetauditrecord"

    def __str__(self) -> str:
        return f"{self.action}:{self.target}"


class NodeSample(models.Model):
    """One point of a node's gauges over time, for the console's fleet charts (no Prometheus server needed).

    Written from heartbeats at most every ``QUIVER_NODE_SAMPLE_INTERVAL_S`` per node and deleted after
    ``QUIVER_NODE_SAMPLE_RETENTION_S`` (``inference.fleet.node_samples``), so a node keeps at most
    retention / interval rows (8,640 at the defaults, 10 s over 24 h). ``kv_cache_usage_perc`` is 0..1;
    ``num_preemptions_total`` is vLLM's cumulative counter; ``gpu_used`` / ``cpu_used`` are adapters in GPU slots and
    in the engine's CPU cache (GPU residents included, as vLLM's ``max_cpu_loras`` counts them).
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="samples")
    t = models.DateTimeField()
    healthy = models.BooleanField(default=False)
    kv_cache_usage_perc = models.FloatField(null=True)
    num_requests_running = models.IntegerField(null=True)
    num_requests_waiting = models.IntegerField(null=True)
    num_preemptions_total = models.FloatField(null=True)
    gpu_used = models.PositiveIntegerField(default=0)
    cpu_used = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "gateway_nodesample"
        indexes = [models.Index(fields=["node", "t"], name="nodesample_node_t")]

    def __str__(self) -> str:
        return f"{self.node_id}@{self.t.isoformat()}"


class FleetGone(models.Model):
    """A node or placement row deleted (``kind`` ``node`` | ``placement``, ``row_id`` its primary key), written by a
    PostgreSQL trigger with the deleting transaction's ``change_xid`` (see the module docstring), so that readers of
    changes learn of deletions too. The trigger drops records older than ``GONE_KEEP_S`` (a reader further behind
    re-reads everything)."""

    kind = models.CharField(max_length=10)
    row_id = models.BigIntegerField()
    change_xid = models.BigIntegerField()
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["change_xid"], name="fleet_gone_change_xid")]

    def __str__(self) -> str:
        return f"{self.kind}:{self.row_id} gone"


# How long the trigger keeps a FleetGone record (migration fleet.0003 writes the same figure into its SQL): far above
# the longest a reader of changes goes without a full re-read (inference.gateway.fleet_reader.FULL_EVERY_S).
GONE_KEEP_S = 600


# Tiers in which a version is loaded in the engine (its CPU cache or a GPU slot).
RESIDENT = (Placement.Tier.WARM, Placement.Tier.HOT)
