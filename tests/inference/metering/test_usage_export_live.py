"""The usage CSV export through the real ASGI stack (uvicorn serving ``config.asgi``): every row, in batches."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from inference.metering.api import CSV_BATCH_LINES
from inference.metering.models import UsageRecord
from tenants.services import api_key_create
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_csv_export_over_asgi_streams_every_row(gateway_server: str, base_model) -> None:  # type: ignore[no-untyped-def]
    tenant = TenantFactory()
    key = api_key_create(tenant, name="k")[1]
    n = CSV_BATCH_LINES + 500  # more than one batch read from the database cursor
    now = timezone.now()
    UsageRecord.objects.bulk_create([
        UsageRecord(tenant=tenant, base_model=base_model, model_name="tiny-llama", endpoint="completions",
                    stream=False, status_code=200, prompt_tokens=1, completion_tokens=i, latency_ms=1.0,
                    created_at=now - timedelta(seconds=i))
        for i in range(n)])

    with httpx.stream("GET", gateway_server + "/api/v1/usage", params={"export": "csv"}, timeout=60,
                      headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/csv")
        body = b"".join(response.iter_raw()).decode()

    lines = body.splitlines()
    assert lines[0].startswith("created_at,model,version,endpoint")
    assert sorted(int(line.split(",")[7]) for line in lines[1:]) == list(range(n))  # each row once
