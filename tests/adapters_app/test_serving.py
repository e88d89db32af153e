"""Serving rules through the API and the services: a new version takes no traffic unless promoted, promote / canary
/ rollback with an audit trail, settings, scoped keys; and the gateway's resolve path over the same rows (the 90/10
split measured over 1,000 requests without an engine)."""

from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.utils.dateparse import parse_datetime
from rest_framework.test import APIClient

from adapters_app.models import Adapter, AdapterVersion, ServingChange
from adapters_app.services import adapter_create
from adapters_app.serving import serving_on_ready
from inference.gateway.app import GatewayApp
from inference.gateway.directory import load_key
from inference.gateway.errors import GatewayError
from inference.gateway.snapshot import KeyView
from tenants.models import Tenant
from tenants.services import api_key_create, membership_create

pytestmark = pytest.mark.django_db


def _ready(tenant: Tenant, adapter: Adapter, number: int, **extra: object) -> AdapterVersion:
    version = AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=number, sha256=f"{number:064d}",
                                            size_bytes=1, s3_prefix="x/", files=[], status="ready", **extra)
    serving_on_ready(version)
    return version


def _rule(adapter: Adapter) -> list[list[int]]:
    adapter.refresh_from_db()
    return adapter.serving_rule


def _key(plaintext: str) -> KeyView:
    view = load_key(plaintext.split("_", 1)[1].split(".")[0])
    assert view is not None
    return view


def test_the_first_ready_version_serves_and_later_ones_wait_for_promotion(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client, tenant, _ = make_client()
    bot = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    _ready(tenant, bot, 1)
    assert _rule(bot) == [[1, 100]]
    _ready(tenant, bot, 2)
    assert _rule(bot) == [[1, 100]]
    listed = client.get("/api/v1/adapters/bot").json()
    assert listed["serving_version"] == 1 and listed["serving_rule"] == [{"version": 1, "weight": 100}]
    _ready(tenant, bot, 3, on_ready={"promote": True})
    assert _rule(bot) == [[3, 100]]
    _ready(tenant, bot, 4, on_ready={"canary": 20})
    assert _rule(bot) == [[3, 80], [4, 20]]
    bot.auto_promote = True
    bot.save()
    _ready(tenant, bot, 5)
    assert _rule(bot) == [[5, 100]]
    actions = list(ServingChange.objects.filter(adapter=bot).order_by("pk").values_list("action", flat=True))
    assert actions == ["first_ready", "upload_promote", "upload_canary", "auto_promote"]


def test_promote_canary_rollback_and_the_audit_trail_through_the_api(make_session_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client, tenant, user = make_session_client()
    bot = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    for n in (1, 2, 3):
        _ready(tenant, bot, n)
    answer = client.post("/api/v1/adapters/bot/promote", {"version": 2}, format="json")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    # No live node here: nothing to wait for, and the answer says so.
    assert body["rule"] == [{"version": 2, "weight": 100}] and body["warm"] == {"2": "no_node"}
    assert body["serving_since"] and body["previous_rule"] == [{"version": 1, "weight": 100}]
    again = client.post("/api/v1/adapters/bot/promote", {"version": 2}, format="json").json()
    assert again["rule"] == body["rule"] and again["serving_since"] is not None  # unchanged: since its last change
    assert abs(parse_datetime(again["serving_since"]) - parse_datetime(body["serving_since"])) < timedelta(seconds=1)
    body = client.post("/api/v1/adapters/bot/canary", {"version": 3, "percent": 10}, format="json").json()
    assert body["rule"] == [{"version": 2, "weight": 90}, {"version": 3, "weight": 10}]
    assert body["warm"] == {"3": "no_node"}  # the joining version is asked for, not the one whose share shrinks
    body = client.post("/api/v1/adapters/bot/canary", {"split": [{"version": 1, "weight": 30},
                                                                 {"version": 3, "weight": 70}]}, format="json").json()
    assert body["rule"] == [{"version": 3, "weight": 70}, {"version": 1, "weight": 30}]
    # The canary's share grew (10 → 70): it is warmed again before it takes more traffic, as a joining one is.
    assert body["warm"] == {"1": "no_node", "3": "no_node"}
    body = client.post("/api/v1/adapters/bot/rollback").json()
    assert body["rule"] == [{"version": 2, "weight": 90}, {"version": 3, "weight": 10}]
    body = client.post("/api/v1/adapters/bot/rollback").json()  # a second rollback undoes the first
    assert body["rule"] == [{"version": 3, "weight": 70}, {"version": 1, "weight": 30}]
    history = client.get("/api/v1/adapters/bot/serving").json()["history"]
    assert [h["action"] for h in history[:5]] == ["rollback", "rollback", "canary", "canary", "promote"]
    assert history[0]["actor"] == user.username and history[0]["key_name"] is None
    assert history[4]["before"] == [[1, 100]] and history[4]["after"] == [[2, 100]]


def test_the_audit_trail_names_the_key_that_acted(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    # Fresh-user round (issue 30): a change made with a key read "key:3f9a…", an id nobody recognises.
    client, tenant, _ = make_client()
    bot = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    for n in (1, 2):
        _ready(tenant, bot, n)
    assert client.post("/api/v1/adapters/bot/promote", {"version": 2}, format="json").status_code == 200
    _, other_tenant, _ = make_client()
    foreign, _ = api_key_create(other_tenant, name="not-yours")
    ServingChange.objects.create(tenant=tenant, adapter=bot, actor=f"key:{foreign.key_id}", action="promote")
    history = client.get("/api/v1/adapters/bot/serving").json()["history"]
    mine = tenant.api_keys.get(name="test")
    # Another tenant's key is never named, even if its id were in this trail.
    assert [(h["actor"], h["key_name"]) for h in history[:2]] == [(f"key:{foreign.key_id}", None),
                                                                   (f"key:{mine.key_id}", "test")]
    assert history[-1]["actor"] == "system" and history[-1]["key_name"] is None


def test_bad_rules_are_400_naming_the_fix(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client, tenant, _ = make_client()
    bot = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    _ready(tenant, bot, 1)
    AdapterVersion.objects.create(tenant=tenant, adapter=bot, number=2, sha256="2" * 64, size_bytes=1, s3_prefix="x/",
                                  files=[], status="rejected")
    answer = client.post("/api/v1/adapters/bot/promote", {"version": 2}, format="json")
    assert answer.status_code == 400 and answer.json()["code"] == "serving_rule_invalid"
    assert "not ready" in answer.json()["detail"]
    answer = client.post("/api/v1/adapters/bot/canary", {"split": [{"version": 1, "weight": 50}]}, format="json")
    assert answer.status_code == 400 and "sum to 100" in answer.json()["detail"]
    assert client.post("/api/v1/adapters/bot/rollback").json()["code"] == "nothing_to_roll_back"
    assert client.post("/api/v1/adapters/nope/promote", {"version": 1}, format="json").status_code == 404


def test_a_canary_that_would_change_nothing_or_move_the_majority_is_400_naming_the_fix(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client, tenant, _ = make_client()
    bot = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    _ready(tenant, bot, 1)
    answer = client.post("/api/v1/adapters/bot/canary", {"version": 1, "percent": 10}, format="json")
    assert answer.status_code == 400, answer.content
    body = answer.json()
    assert body["code"] == "serving_rule_invalid" and "already takes all traffic" in body["detail"]
    assert "upload a new version" in body["fields"]["version"][0]
    _ready(tenant, bot, 2)
    assert client.post("/api/v1/adapters/bot/canary", {"version": 2, "percent": 10}, format="json").status_code == 200
    answer = client.post("/api/v1/adapters/bot/canary", {"version": 1, "percent": 10}, format="json")
    assert answer.status_code == 400 and "takes 90 % now" in answer.json()["detail"]
    assert "promote" in answer.json()["fields"]["version"][0]
    assert _rule(bot) == [[1, 90], [2, 10]]
    assert list(ServingChange.objects.filter(adapter=bot).values_list("action", flat=True)) == ["first_ready",
                                                                                                "canary"]


def test_a_version_that_does_not_exist_is_named_so_with_the_adapters_versions(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    """Before: ``promote {"version": 7}`` on a two-version adapter read "Version 7 is not ready"."""
    client, tenant, _ = make_client()
    bot = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    _ready(tenant, bot, 1)
    _ready(tenant, bot, 2)
    for path, payload in [("promote", {"version": 7}), ("canary", {"version": 7, "percent": 10}),
                          ("canary", {"split": [{"version": 1, "weight": 90}, {"version": 7, "weight": 10}]})]:
        answer = client.post(f"/api/v1/adapters/bot/{path}", payload, format="json")
        assert answer.status_code == 400, (path, answer.content)
        detail = answer.json()["detail"]
        assert "has no version 7" in detail and "v1 (ready), v2 (ready)" in detail, detail
        assert "/api/v1/adapters/bot/versions" in detail and "not ready" not in detail
        assert answer.json()["fields"]["version"] == [detail]


def test_serving_settings_are_audited_and_reach_the_gateway_limits(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client, tenant, plaintext = make_client()
    bot = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    _ready(tenant, bot, 1)
    body = client.patch("/api/v1/adapters/bot/serving", {"auto_promote": True, "rpm_limit": 7}, format="json").json()
    assert body["auto_promote"] is True and body["rpm_limit"] == 7 and body["history"][0]["action"] == "settings"
    target = async_to_sync(GatewayApp(background=False).resolve)(_key(plaintext), "bot")
    assert target.adapter_limits.rpm == 7 and target.adapter_id == bot.pk
    # Saving the same values again changes nothing, so no row (before, each save wrote one with before == after);
    # a partly changed save records only the field that changed.
    client.patch("/api/v1/adapters/bot/serving", {"auto_promote": True, "rpm_limit": 7}, format="json")
    client.patch("/api/v1/adapters/bot/serving", {"auto_promote": True, "rpm_limit": 8}, format="json")
    rows = list(ServingChange.objects.filter(adapter=bot, action="settings").order_by("pk").values_list("before",
                                                                                                       "after"))
    assert rows == [([{"auto_promote": False, "rpm_limit": None}], [{"auto_promote": True, "rpm_limit": 7}]),
                    ([{"rpm_limit": 7}], [{"rpm_limit": 8}])]


def test_a_90_10_split_over_1000_requests_on_the_resolve_path_and_sticky_users(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client, tenant, plaintext = make_client()
    bot = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    _ready(tenant, bot, 1)
    _ready(tenant, bot, 2)
    assert client.post("/api/v1/adapters/bot/canary", {"version": 2, "percent": 10}, format="json").status_code == 200
    app, key = GatewayApp(background=False), _key(plaintext)
    random.seed(32)

    async def run() -> tuple[Counter[int | None], dict[str, set[int | None]]]:
        counts: Counter[int | None] = Counter()
        for _ in range(1000):
            counts[(await app.resolve(key, "bot")).version_number] += 1
        seen: dict[str, set[int | None]] = {}
        for i in range(100):
            for _ in range(5):
                seen.setdefault(f"user-{i}", set()).add((await app.resolve(key, "bot", f"user-{i}")).version_number)
        return counts, seen

    counts, seen = async_to_sync(run)()
    assert set(counts) == {1, 2} and 70 <= counts[2] <= 130, counts
    assert all(len(versions) == 1 for versions in seen.values())
    assert {v for versions in seen.values() for v in versions} == {1, 2}


def test_name_at_n_and_scoped_keys_on_the_resolve_path(base_model) -> None:  # type: ignore[no-untyped-def]
    from tests.factories import TenantFactory

    tenant = TenantFactory()
    a = adapter_create(tenant, name="alpha", base_model_name="tiny-llama")
    b = adapter_create(tenant, name="beta", base_model_name="tiny-llama")
    _ready(tenant, a, 1)
    _ready(tenant, a, 2)
    _ready(tenant, b, 1)
    AdapterVersion.objects.create(tenant=tenant, adapter=a, number=3, sha256="3" * 64, size_bytes=1, s3_prefix="x/",
                                  files=[], status="rejected")
    _, everything = api_key_create(tenant, name="all")
    _, only_alpha = api_key_create(tenant, name="a", adapters=["alpha"])
    _, only_alpha_2 = api_key_create(tenant, name="a2", adapters=["alpha@2"])
    app = GatewayApp(background=False)

    def resolve(plaintext: str, model: str) -> int | str | None:
        try:
            return async_to_sync(app.resolve)(_key(plaintext), model).version_number
        except GatewayError as exc:
            return f"{exc.status} {exc.code}"

    assert resolve(everything, "alpha") == 1
    assert resolve(everything, "alpha@2") == 2 and resolve(everything, "alpha@1") == 1
    for missing in ("alpha@3", "alpha@9", "alpha@x", "alpha@"):
        assert resolve(everything, missing) == "404 model_not_found"

    def message(plaintext: str, model: str) -> str:
        with pytest.raises(GatewayError) as caught:
            async_to_sync(app.resolve)(_key(plaintext), model)
        return caught.value.message

    # Its own adapter's missing version says which part is wrong (fresh-user round); anything else, one answer.
    assert message(everything, "alpha@9").startswith("Adapter `alpha` has no ready version 9;")
    assert message(everything, "alpha@3").startswith("Adapter `alpha` has no ready version 3;")  # rejected
    assert message(everything, "gamma@1").startswith("The model `gamma@1` does not exist.")  # no such adapter
    # Outside a scoped key's list: the key is told its own scope, and never that base models are callable (fresh-user
    # round: a key limited to adapters was pointed at "the base models", which it cannot call).
    scoped = message(only_alpha, "beta@9")
    assert scoped.startswith("The model `beta@9` does not exist or is outside this key's scope.")
    assert "only `alpha`" in scoped and "base model" not in scoped
    assert "base models" in message(everything, "gamma@1")  # an unscoped key can call them
    assert "base model" not in message(only_alpha, "tiny-llama")
    # However the number is written, the target (and so usage) names the version one way (attack round: alpha@01
    # and alpha@0001 were separate usage rows).
    for spelled in ("alpha@02", "alpha@0002"):
        assert async_to_sync(app.resolve)(_key(everything), spelled).requested == "alpha@2"
    assert resolve(only_alpha, "alpha@2") == 2
    for refused in ("beta", "beta@1", "tiny-llama"):
        assert resolve(only_alpha, refused) == "404 model_not_found"
    assert resolve(only_alpha_2, "alpha@2") == 2
    assert resolve(only_alpha_2, "alpha") == "404 model_not_found"


def test_keys_scoped_to_adapters_through_the_api(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    client, tenant, _ = make_client()
    made = client.post("/api/v1/api-keys", {"name": "scoped", "adapters": ["alpha", "beta@2"]}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["adapters"] == ["alpha", "beta@2"]
    assert client.post("/api/v1/api-keys", {"name": "bad", "adapters": ["Not A Name"]},
                       format="json").status_code == 400
    # A key minted by a scoped key is no wider than it.
    from rest_framework.test import APIClient

    scoped = APIClient()
    scoped.credentials(HTTP_AUTHORIZATION=f"Bearer {made.json()['secret']}")
    child = scoped.post("/api/v1/api-keys", {"name": "child", "scopes": ["inference"]}, format="json")
    assert child.status_code == 201 and child.json()["adapters"] == ["alpha", "beta@2"]
    wider = scoped.post("/api/v1/api-keys", {"name": "w", "scopes": ["inference"], "adapters": ["gamma"]},
                        format="json")
    assert wider.status_code == 400
    adapter_create(tenant, name="gamma", base_model_name="tiny-llama")
    assert scoped.get("/api/v1/adapters/gamma/serving").status_code == 404


def test_an_adapters_limits_are_a_limit_scope_beside_the_tenants_and_the_keys(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    from inference.gateway.app import _scopes

    client, tenant, plaintext = make_client()
    bot = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    _ready(tenant, bot, 1)
    app, key = GatewayApp(background=False), _key(plaintext)
    assert [s.name for s in _scopes(key, async_to_sync(app.resolve)(key, "bot"))] == [
        f"tenant:{tenant.pk}", f"key:{key.pk}"]
    client.patch("/api/v1/adapters/bot/serving", {"tpm_limit": 500}, format="json")
    scopes = _scopes(key, async_to_sync(GatewayApp(background=False).resolve)(key, "bot@1"))
    assert scopes[-1].name == f"adapter:{bot.pk}" and scopes[-1].limits.tpm == 500 and scopes[-1].label == "adapter bot"


def test_an_adapter_without_a_rule_keeps_serving_its_first_ready_version(make_client, base_model) -> None:  # type: ignore[no-untyped-def]
    """Versions made ready outside the validation path (rows written directly) leave the rule empty: the gateway
    and the API agree on the first ready version, and a newer one becoming ready does not take its traffic."""
    client, tenant, plaintext = make_client()
    bot = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    for n in (1, 2):
        AdapterVersion.objects.create(tenant=tenant, adapter=bot, number=n, sha256=f"{n:064d}", size_bytes=1,
                                      s3_prefix="x/", files=[], status="ready")
    assert client.get("/api/v1/adapters/bot").json()["serving_rule"] == [{"version": 1, "weight": 100}]
    assert client.get("/api/v1/adapters/bot/serving").json()["rule"] == [{"version": 1, "weight": 100}]
    assert async_to_sync(GatewayApp(background=False).resolve)(_key(plaintext), "bot").version_number == 1
    _ready(tenant, bot, 3)
    assert _rule(bot) == [[1, 100]]
    body = client.post("/api/v1/adapters/bot/canary", {"version": 3, "percent": 5}, format="json").json()
    assert body["rule"] == [{"version": 1, "weight": 95}, {"version": 3, "weight": 5}]


def test_only_an_owner_raises_or_clears_an_adapters_limits(make_session_client, django_user_model, base_model) -> None:  # type: ignore[no-untyped-def]
    """A member lifted the rpm and tpm limits an owner had set on an adapter (attack round); as for keys' limits, a
    member (or a key without ``keys:manage``) may tighten them only."""
    owner, tenant, _ = make_session_client()
    bot = adapter_create(tenant, name="bot", base_model_name="tiny-llama")
    _ready(tenant, bot, 1)
    assert owner.patch("/api/v1/adapters/bot/serving", {"rpm_limit": 5, "tpm_limit": 1000},
                       format="json").status_code == 200
    user = django_user_model.objects.create_user(username=f"member-{tenant.slug}", password="pw-not-used")
    membership_create(tenant, user=user, role="member")
    member = APIClient()
    member.force_login(user)
    _, writer_key = api_key_create(tenant, name="writer", scopes=["adapters:read", "adapters:write"])
    writer = APIClient()
    writer.credentials(HTTP_AUTHORIZATION=f"Bearer {writer_key}")
    for caller in (member, writer):
        for looser in ({"rpm_limit": None}, {"tpm_limit": 10**6}, {"auto_promote": True, "rpm_limit": 6}):
            answer = caller.patch("/api/v1/adapters/bot/serving", looser, format="json")
            assert answer.status_code == 403 and answer.json()["code"] == "limit_owner_only", answer.content
    bot.refresh_from_db()
    assert (bot.rpm_limit, bot.tpm_limit, bot.auto_promote) == (5, 1000, False)
    assert member.patch("/api/v1/adapters/bot/serving", {"rpm_limit": 4, "auto_promote": True},
                        format="json").status_code == 200  # tightening, and other settings, stay open
    _, manager_key = api_key_create(tenant, name="manager")  # every scope, keys:manage included: an owner's reach
    manager = APIClient()
    manager.credentials(HTTP_AUTHORIZATION=f"Bearer {manager_key}")
    assert manager.patch("/api/v1/adapters/bot/serving", {"rpm_limit": None}, format="json").status_code == 200
    assert owner.patch("/api/v1/adapters/bot/serving", {"tpm_limit": None}, format="json").status_code == 200
    bot.refresh_from_db()
    assert (bot.rpm_limit, bot.tpm_limit) == (None, None)
