"""The one rule behind ``limit_owner_only`` (``tenants.services.limits_loosened``), used by the key views and the
adapter serving view alike: who is not an owner may tighten a limit an owner set, never clear or raise it, nor pick
a higher priority class. Pure: plain objects stand in for a key and an adapter (the rule reads attributes only);
the views' answers are tested on PostgreSQL in ``test_member_key_limits`` and ``adapters_app/test_serving``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tenants.services import limits_loosened

KEY = SimpleNamespace(rpm_limit=10, tpm_limit=None, concurrency_limit=2, max_tokens_limit=64, priority_class="normal")
ADAPTER = SimpleNamespace(rpm_limit=10, tpm_limit=1000, auto_promote=False)


@pytest.mark.parametrize(("holder", "changes", "loosened"), [
    (KEY, {"rpm_limit": 5}, None),  # tightened
    (KEY, {"rpm_limit": 10}, None),  # kept
    (KEY, {"rpm_limit": 11}, "rpm_limit"),  # raised
    (KEY, {"concurrency_limit": None}, "concurrency_limit"),  # cleared
    (KEY, {"tpm_limit": 500}, None),  # unlimited before: any figure tightens
    (KEY, {"tpm_limit": None}, None),
    (KEY, {"rpm_limit": 1, "max_tokens_limit": 65}, "max_tokens_limit"),  # the first looser one is named
    (KEY, {"priority_class": "low"}, None),
    (KEY, {"priority_class": None}, None),  # null ranks as normal
    (KEY, {"priority_class": "high"}, "priority_class"),
    (ADAPTER, {"tpm_limit": 2000}, "tpm_limit"),
    (ADAPTER, {"rpm_limit": None}, "rpm_limit"),
    (ADAPTER, {"rpm_limit": 3, "tpm_limit": 10}, None),
    (ADAPTER, {"auto_promote": True}, None),  # not a limit
])
def test_only_a_change_that_lets_the_holder_do_more_is_named(holder: object, changes: dict[str, object],
                                                             loosened: str | None) -> None:
    assert limits_loosened(holder, changes) == loosened
