"""The usage page in a real browser (issue 30's fresh-user round): with more models than the chart has colours,
no two lines share one (the quietest are one grey "other" line), the legend names models as applications call them
(``capitals``, ``capitals@2``), and a quiet adapter's token rate is not written 0.0."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from adapters_app.models import AdapterVersion
from adapters_app.services import adapter_create
from inference.metering.models import UsageRecord
from tests.console.conftest import login, screenshot
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)

# 11 models called in the last hour, busiest first: the chart has 9 colours, so 8 lines and "other (3 models)".
MODELS = ["capitals", "capitals@2", *(f"bot-{i:02d}" for i in range(9))]


def test_many_models_keep_distinct_colours_and_served_names(console: Any, make_user: Any, base_model: Any) -> None:
    tenant = TenantFactory(slug="acme", name="Acme")
    adapter = adapter_create(tenant, name="capitals", base_model_name="tiny-llama")
    version = AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=2, sha256="2" * 64, size_bytes=1,
                                            s3_prefix="x/", files=[], status="ready")
    now = timezone.now()
    UsageRecord.objects.bulk_create(
        UsageRecord(tenant=tenant, base_model=base_model, model_name=model, endpoint="completions", status_code=200,
                    prompt_tokens=2, completion_tokens=1, latency_ms=10.0, created_at=now - timedelta(minutes=i % 5),
                    adapter_version=version if model.startswith("capitals") else None,
                    version_number=2 if model.startswith("capitals") else None)
        for rank, model in enumerate(MODELS) for i in range(len(MODELS) - rank))
    make_user("alice", tenant, role="viewer")
    page = console()
    login(page, "alice")
    page.goto("/usage")
    chart = page.get_by_role("img", name="Requests per model over time")
    legend = chart.locator(".recharts-legend-wrapper")
    for label in ("capitals", "capitals@2", "bot-05", "other (3 models)"):
        expect(legend.get_by_text(label, exact=True)).to_be_visible()
    expect(legend).not_to_contain_text("capitals v2")
    expect(legend).to_have_text(re.compile(r"^bot-00.*capitals@2\s*other \(3 models\)$"))  # by name, "other" last
    expect(legend.get_by_text("bot-08", exact=True)).to_have_count(0)  # among the quietest three
    strokes = chart.locator("path.recharts-line-curve").evaluate_all("ps => ps.map(p => p.getAttribute('stroke'))")
    assert len(strokes) == 9 and len(set(strokes)) == 9, strokes
    # the quietest: one request of 3 tokens in the hour, which the table wrote as 0.0 tokens/s
    expect(page.get_by_test_id("traffic-acme-bot-08").get_by_role("cell").nth(2)).to_have_text("3/h")
    # capitals v2, called as capitals and capitals@2: 21 requests of 3 tokens, 63 an hour
    expect(page.get_by_test_id("traffic-acme-capitals").get_by_role("cell").nth(2)).to_have_text("1.1/min")
    screenshot(page, "usage-many-models")
