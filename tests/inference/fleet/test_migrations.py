"""A database made before the gateway split (its fleet and metering tables owned by the ``gateway`` app) upgrades in
place: the migrations move only Django's state, so every row is still there, now read through the new apps."""

from __future__ import annotations

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from inference.fleet.models import FleetAuditRecord, Node, NodeSample, TenantResidencyQuota
from inference.metering.models import UsageRecord

BEFORE_SPLIT = [("gateway", "0008_placement_load_issued_at"), ("fleet", None), ("metering", None)]


@pytest.mark.django_db(transaction=True)
def test_a_database_from_before_the_split_keeps_its_rows_and_tables() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE_SPLIT)
    old = MigrationExecutor(connection)._create_project_state(with_applied_migrations=True).apps
    assert old.get_model("gateway", "Node")._meta.db_table == "gateway_node"
    tables_before = set(connection.introspection.table_names())
    tenant = old.get_model("tenants", "Tenant").objects.create(slug="mig", name="Mig")
    node = old.get_model("gateway", "Node").objects.create(name="n-old", agent_url="http://a:1",
                                                           engine_url="http://e:1", max_loras=4)
    old.get_model("gateway", "NodeSample").objects.create(node=node, t=timezone.now(), gpu_used=2)
    old.get_model("gateway", "FleetAuditRecord").objects.create(actor="op", action="pin", target="v1")
    old.get_model("gateway", "TenantResidencyQuota").objects.create(tenant=tenant, max_pinned=3)
    old.get_model("gateway", "UsageRecord").objects.create(
        tenant=tenant, node=node, endpoint="completions", status_code=200, prompt_tokens=5, completion_tokens=7,
        latency_ms=1.0, request_id="r-old")

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    # No table renamed or dropped; the only ones added are later migrations' (hourly usage sums, fleet tombstones).
    assert set(connection.introspection.table_names()) == tables_before | {"metering_usagehour", "fleet_fleetgone"}
    moved = Node.objects.get(name="n-old")
    assert moved.max_loras == 4 and NodeSample.objects.get(node=moved).gpu_used == 2
    assert FleetAuditRecord.objects.get(action="pin").actor == "op"
    assert TenantResidencyQuota.objects.get(tenant__slug="mig").max_pinned == 3
    usage = UsageRecord.objects.get(request_id="r-old")
    assert (usage.node_id, usage.prompt_tokens, usage.completion_tokens) == (moved.pk, 5, 7)
    assert ContentType.objects.get_for_model(Node).app_label == "fleet"
    assert ContentType.objects.get_for_model(UsageRecord).app_label == "metering"
