"""factory_boy factories for tenants and registry rows."""

from __future__ import annotations

import factory
from factory.django import DjangoModelFactory

from tenants.models import Tenant


class TenantFactory(DjangoModelFactory[Tenant]):
    class Meta:
        model = Tenant

    slug = factory.Sequence(lambda n: f"tenant-{n}")
    name = factory.LazyAttribute(lambda t: t.slug.title())
