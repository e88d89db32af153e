"""Control-plane API for adapters: ``/api/v1/adapters``, ``/api/v1/adapters/{name}/versions``, ``/api/v1/base-models``."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Prefetch, QuerySet
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from adapters_app import services, serving
from adapters_app.models import Adapter, AdapterVersion, BaseModel
from adapters_app.selectors import adapter_get, adapter_residency, serving_state
from adapters_app.serializers import (
    AdapterInputSerializer,
    AdapterOutputSerializer,
    AdapterVersionOutputSerializer,
    BaseModelOutputSerializer,
    CanaryInputSerializer,
    PromoteInputSerializer,
    ServingOutputSerializer,
    ServingSettingsInputSerializer,
)
from common.echo import clip
from common.exceptions import QuiverError
from common.parsers import FormParser, JSONParser
from tenants.models import Membership
from tenants.permissions import DEFAULT_ROLE_MAP
from tenants.services import limits_loosened
from tenants.viewsets import TenantScopedViewSet


def _on_ready(request: Request) -> dict[str, Any] | None:
    """The upload's ``promote`` (true/1/yes) or ``canary`` (1..100) form field as ``AdapterVersion.on_ready``.

    Raises:
        QuiverError: 400 ``invalid`` for a canary outside 1..100 or both fields.
    """
    promote = str(request.POST.get("promote", "")).lower() in ("1", "true", "yes", "on")
    raw = request.POST.get("canary")
    if raw in (None, ""):
        return {"promote": True} if promote else None
    if promote or not str(raw).isdigit() or not 1 <= int(raw) <= 100:
        raise QuiverError("'canary' takes a percentage 1..100, and not together with 'promote'.", code="invalid",
                          fields={"canary": ["A whole percentage 1..100, without 'promote'."]})
    return {"canary": int(raw)}


def adapter_not_found(name: str) -> QuiverError:
    """The 404 for an adapter name the caller cannot reach (none of that name, another tenant's, or outside the
    key's adapters: one answer, so nothing is learnt about the others), naming it and where the names are listed.
    DRF's bare "Not found." left `quiver versions ls bot3` with no hint that the name was the problem."""
    return QuiverError(f"No adapter '{clip(name)}' in this tenant; `quiver adapters ls` (GET /api/v1/adapters) lists "
                       "yours.", code="not_found", status_code=404)


class BaseModelViewSet(mixins.ListModelMixin, TenantScopedViewSet):
    """Registered base models (shared by all tenants; listing needs a valid key)."""

    queryset = BaseModel.objects.order_by("base_model_name")
    serializer_class = BaseModelOutputSerializer
    tenant_field = None


class AdapterViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, TenantScopedViewSet
):
    """The tenant's adapters, looked up by name."""

    queryset = Adapter.objects.select_related("base_model").order_by("name")
    serializer_class = AdapterOutputSerializer
    lookup_field = "name"
    adapter_field = "name"
    role_map = {**DEFAULT_ROLE_MAP, "DELETE": Membership.Role.OWNER}

    def get_object(self) -> Adapter:
        """The adapter named in the URL; :func:`adapter_not_found` when the caller has none of that name."""
        try:
            return super().get_object()
        except Http404:
            raise adapter_not_found(self.kwargs["name"]) from None

    def tenant_queryset(self, queryset: QuerySet[Adapter]) -> QuerySet[Adapter]:
        """Prefetch versions newest first, so listing costs two queries whatever the count."""
        newest_first = AdapterVersion.objects.order_by("-number")
        return queryset.prefetch_related(Prefetch("versions", queryset=newest_first, to_attr="versions_newest_first"))

    def list(self, request: Request) -> Response:
        """``GET /api/v1/adapters``: the tenant's adapters with serving version and residency (three queries)."""
        adapters = list(self.get_queryset())
        context = {**self.get_serializer_context(), "residency": adapter_residency([a.pk for a in adapters])}
        return Response(AdapterOutputSerializer(adapters, many=True, context=context).data)

    def retrieve(self, request: Request, name: str) -> Response:
        """``GET /api/v1/adapters/{name}``: one adapter with serving version and residency."""
        adapter = self.get_object()
        context = {**self.get_serializer_context(), "residency": adapter_residency([adapter.pk])}
        return Response(AdapterOutputSerializer(adapter, context=context).data)

    @extend_schema(request=AdapterInputSerializer, responses={201: AdapterOutputSerializer})
    def create(self, request: Request) -> Response:
        """``POST /api/v1/adapters``: create an empty adapter (uploads may also create it). 201 or the service's error."""
        data = AdapterInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        self.adapter_in_reach(data.validated_data["name"])
        adapter = services.adapter_create(
            self.tenant,
            name=data.validated_data["name"],
            base_model_name=data.validated_data["base_model"],
            description=data.validated_data["description"],
        )
        return Response(AdapterOutputSerializer(adapter).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: Adapter) -> None:
        """``DELETE``: remove the adapter, its versions, S3 objects and engine copies (via ``adapter_delete``)."""
        services.adapter_delete(self.tenant, adapter=instance)

    # --- serving rules (docs/versions.md)
    def _actor(self) -> str:
        return serving.actor_name(user=self.principal.user, api_key=self.principal.api_key)

    @staticmethod
    def _serving_body(adapter: Adapter, result: serving.ServingResult | None = None) -> dict[str, Any]:
        body = serving_state(adapter)
        if result is not None:
            body["warm"] = {str(k): v for k, v in result.warm.items()}
            body["serving_since"] = result.serving_since
        return ServingOutputSerializer(body).data

    @extend_schema(methods=["GET"], request=None, responses=ServingOutputSerializer)
    @extend_schema(methods=["PATCH"], request=ServingSettingsInputSerializer, responses=ServingOutputSerializer)
    @action(detail=True, methods=["get", "patch"])
    def serving(self, request: Request, name: str) -> Response:
        """``GET .../serving``: the serving rule, the rule a rollback returns to, settings and the latest changes.
        ``PATCH``: set ``auto_promote``, ``rpm_limit``, ``tpm_limit`` (audited)."""
        adapter = self.get_object()  # a key limited to other adapters: 404 (adapter_field)
        if request.method == "PATCH":
            data = ServingSettingsInputSerializer(data=request.data)
            data.is_valid(raise_exception=True)
            self._owner_for_looser_limits(adapter, data.validated_data)
            adapter = serving.serving_settings_set(self.tenant, adapter=adapter, changes=dict(data.validated_data),
                                                   actor=self._actor())
        return Response(self._serving_body(adapter))

    def _owner_for_looser_limits(self, adapter: Adapter, changes: dict[str, Any]) -> None:
        """Raise 403 ``limit_owner_only`` when ``changes`` clear or raise a limit set on ``adapter`` and the caller is
        not an owner (a session's role, or a key with ``keys:manage``), as for keys' limits (``tenants.views``): a
        member lifted the rpm and tpm limits an owner had set on an adapter (attack round). Tightening stays open."""
        if self.principal.acts_as_owner():
            return
        name = limits_loosened(adapter, changes)  # auto_promote is not a limit: skipped
        if name:
            raise QuiverError(f"Only an owner can raise or clear '{name}' on an adapter; you may only tighten it.",
                              code="limit_owner_only", status_code=403)

    @extend_schema(request=PromoteInputSerializer, responses=ServingOutputSerializer)
    @action(detail=True, methods=["post"])
    def promote(self, request: Request, name: str) -> Response:
        """``POST .../promote``: all traffic to ``version``, warmed on its nodes first (bounded by
        ``QUIVER_PROMOTE_WARM_WAIT_S``); the answer says each version's warm state and ``serving_since``.
        400 ``serving_rule_invalid`` (not a ready version)."""
        adapter = self.get_object()  # a key limited to other adapters: 404 (adapter_field)
        data = PromoteInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        result = serving.serving_promote(self.tenant, adapter=adapter, number=data.validated_data["version"],
                                         actor=self._actor())
        return Response(self._serving_body(result.adapter, result))

    @extend_schema(request=CanaryInputSerializer, responses=ServingOutputSerializer)
    @action(detail=True, methods=["post"])
    def canary(self, request: Request, name: str) -> Response:
        """``POST .../canary``: ``percent`` % to ``version`` beside the current primary (sticky per OpenAI ``user``),
        or a whole ``split``; joining versions are warmed first. 400 ``serving_rule_invalid``."""
        adapter = self.get_object()  # a key limited to other adapters: 404 (adapter_field)
        data = CanaryInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if "split" in data.validated_data:
            rule = [(e["version"], e["weight"]) for e in data.validated_data["split"]]
            result = serving.serving_split(self.tenant, adapter=adapter, rule=rule, actor=self._actor())
        else:
            result = serving.serving_canary(self.tenant, adapter=adapter, number=data.validated_data["version"],
                                            percent=data.validated_data["percent"], actor=self._actor())
        return Response(self._serving_body(result.adapter, result))

    @extend_schema(request=None, responses=ServingOutputSerializer)
    @action(detail=True, methods=["post"])
    def rollback(self, request: Request, name: str) -> Response:
        """``POST .../rollback``: back to the rule before the last change, at once (no warm wait). 409
        ``nothing_to_roll_back``."""
        adapter = self.get_object()  # a key limited to other adapters: 404 (adapter_field)
        result = serving.serving_rollback(self.tenant, adapter=adapter, actor=self._actor())
        return Response(self._serving_body(result.adapter, result))


class AdapterVersionViewSet(mixins.ListModelMixin, TenantScopedViewSet):
    """Versions of one adapter: list, retrieve by number, upload (multipart ``files``, optional ``base_model``)."""

    queryset = AdapterVersion.objects.select_related("adapter").order_by("-number")
    serializer_class = AdapterVersionOutputSerializer
    parser_classes = [MultiPartParser, FormParser, JSONParser]
    lookup_field = "number"
    adapter_field = "adapter__name"

    def tenant_queryset(self, queryset):  # type: ignore[no-untyped-def]
        """Versions of the adapter named in the URL (already limited to the caller's tenant)."""
        return queryset.filter(adapter__name=self.kwargs["adapter_name"])

    def list(self, request: Request, adapter_name: str) -> Response:
        """``GET .../versions``: newest first; 404 :func:`adapter_not_found` when the caller has no such adapter
        (or its key is limited to others: the same answer)."""
        self._adapter_reachable(adapter_name)
        return super().list(request)

    def _adapter_reachable(self, name: str) -> None:
        """Raise :func:`adapter_not_found` unless the caller reaches an adapter ``name`` of its tenant."""
        try:
            self.adapter_in_reach(name)
        except Http404:
            raise adapter_not_found(name) from None
        if adapter_get(self.tenant, name=name) is None:
            raise adapter_not_found(name)

    def get_object(self) -> AdapterVersion:
        """The version in the URL; a 404 that says whether the adapter or the version is missing (DRF's bare
        "Not found." named neither)."""
        try:
            return super().get_object()
        except Http404:
            name = self.kwargs["adapter_name"]
            self._adapter_reachable(name)
            raise QuiverError(f"Adapter '{name}' has no version {clip(str(self.kwargs.get('number')))}; "
                              f"`quiver versions ls {name}` lists them.", code="not_found", status_code=404) from None

    def retrieve(self, request: Request, adapter_name: str, number: str) -> Response:
        """``GET .../versions/{number}``: one version with its validation report."""
        return Response(self.get_serializer(self.get_object()).data)

    @extend_schema(
        request={"multipart/form-data": {"type": "object", "properties": {
            "files": {"type": "array", "items": {"type": "string", "format": "binary"}},
            "base_model": {"type": "string"},
            "promote": {"type": "boolean", "description": "Take all traffic once ready (warmed first)."},
            "canary": {"type": "integer", "minimum": 1, "maximum": 100,
                       "description": "Take this percentage of traffic once ready."}},
            "required": ["files"]}},
        responses={200: AdapterVersionOutputSerializer, 201: AdapterVersionOutputSerializer})
    def create(self, request: Request, adapter_name: str) -> Response:
        """``POST .../versions``: upload (201 new, 200 identical bytes); 413 before parsing when the body is too large;
        404 for a key limited to other adapters."""
        self.adapter_in_reach(adapter_name)
        # Refuse oversized bodies before Django spools them to disk (multipart framing adds a few KiB).
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
        if declared > settings.QUIVER_MAX_UPLOAD_BYTES + 64 * 1024:
            raise QuiverError(
                f"Upload of {declared} bytes exceeds QUIVER_MAX_UPLOAD_BYTES={settings.QUIVER_MAX_UPLOAD_BYTES}; shrink "
                "the adapter or ask an operator to raise the limit.", code="upload_too_large", status_code=413)
        version, created = services.adapter_version_upload(
            self.tenant,
            adapter_name=adapter_name,
            upload_files=request.FILES.getlist("files"),
            base_model_name=request.POST.get("base_model") or None,
            on_ready=_on_ready(request),
        )
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(AdapterVersionOutputSerializer(version).data, status=code)
