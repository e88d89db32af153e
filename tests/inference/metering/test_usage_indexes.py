"""The usage records' indexes on PostgreSQL: ``request_id`` unique, without the LIKE index no query uses."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from inference.metering.models import UsageRecord
from tests.factories import TenantFactory


@pytest.mark.django_db
def test_request_id_is_unique_through_one_index_and_no_like_index() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [UsageRecord._meta.db_table])
        indexes = dict(cursor.fetchall())
    on_request_id = {name: d for name, d in indexes.items() if "(request_id" in d}
    assert list(on_request_id) == ["usagerecord_request_id_unique"], on_request_id
    assert "UNIQUE" in on_request_id["usagerecord_request_id_unique"]
    assert not any("pattern_ops" in d for d in indexes.values()), indexes
    tenant = TenantFactory()
    row = {"tenant": tenant, "endpoint": "completions", "status_code": 200, "latency_ms": 1.0, "request_id": "r1"}
    UsageRecord.objects.create(**row)
    with pytest.raises(IntegrityError), transaction.atomic():
        UsageRecord.objects.create(**row)
    UsageRecord.objects.bulk_create([UsageRecord(**row), UsageRecord(**{**row, "request_id": "r2"})],
                                    ignore_conflicts=True)  # the drain's redelivery: the known id is skipped
    assert sorted(UsageRecord.objects.values_list("request_id", flat=True)) == ["r1", "r2"]
