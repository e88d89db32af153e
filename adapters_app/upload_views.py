"""Browser-direct uploads API: ``/api/v1/adapters/{name}/uploads`` (protocol in ``adapters_app.direct_upload``).

JSON for API clients; ``complete`` also takes S3's own ``CompleteMultipartUpload`` XML body, and ``parts`` and
``complete`` answer in S3's XML with ``?dialect=s3``, so Uppy's S3 client (``@uppy/aws-s3``'s ``signRequest`` mode)
can be pointed at them while the part bytes go straight to S3.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import IO, Any
from xml.sax.saxutils import escape

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, parsers, serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import ParseError
from rest_framework.request import Request
from rest_framework.response import Response

from adapters_app import direct_upload
from adapters_app.models import Upload
from common.exceptions import QuiverError
from common.parsers import JSONParser
from tenants.viewsets import TenantScopedViewSet

MAX_XML_BYTES = 2 * 1024 * 1024  # 10,000 parts of ~100 bytes each, with room
_PART_XML = re.compile(r"<Part>\s*<PartNumber>\s*(\d{1,5})\s*</PartNumber>\s*<ETag>([^<]{0,200})</ETag>\s*</Part>")


class S3CompleteXmlParser(parsers.BaseParser):
    """S3's ``<CompleteMultipartUpload><Part><PartNumber/><ETag/></Part>…`` body as ``{"parts": [...]}``.

    A fixed pattern, never an XML parser: no entities, no DOCTYPE, bounded size.
    """

    media_type = "application/xml"

    def parse(self, stream: IO[Any], media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        """Raises ``ParseError`` for a body over 2 MiB or one that is not a CompleteMultipartUpload."""
        body = stream.read(MAX_XML_BYTES + 1) if stream is not None else b""
        if len(body) > MAX_XML_BYTES:
            raise ParseError("CompleteMultipartUpload body over 2 MiB.")
        text = body.decode("utf-8", errors="replace")
        if "<CompleteMultipartUpload" not in text or "<!" in text:
            raise ParseError("Expected S3's CompleteMultipartUpload XML.")
        parts = [{"PartNumber": int(n), "ETag": etag.replace("&quot;", '"').strip()}
                 for n, etag in _PART_XML.findall(text)]
        return {"parts": parts}


class UploadFileInputSerializer(serializers.Serializer):
    """One declared file: its name, size in bytes and hex sha256."""
    name = serializers.CharField(max_length=200)
    size = serializers.IntegerField(min_value=1)
    sha256 = serializers.RegexField(r"^[0-9a-f]{64}$", max_length=64)


class UploadCreateInputSerializer(serializers.Serializer):
    """Input of ``POST .../uploads``: the files to upload, and ``base_model`` to create the adapter."""
    files = serializers.ListField(child=UploadFileInputSerializer(), min_length=1, max_length=4)
    base_model = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class UploadFileOutputSerializer(serializers.Serializer):
    """A declared file: ``parts`` is how many parts of ``part_size`` it takes; ``upload_id`` is S3's."""
    name = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()
    upload_id = serializers.CharField()
    parts = serializers.IntegerField()
    completed = serializers.BooleanField()


class UploadOutputSerializer(serializers.Serializer):
    """An upload: ``state`` ``open → verifying → done | failed``, or ``aborted``; ``version`` once ``done``."""
    id = serializers.CharField(source="public_id")
    adapter = serializers.CharField(source="adapter_name")
    state = serializers.ChoiceField(choices=Upload.State.choices)
    part_size = serializers.IntegerField()
    files = serializers.SerializerMethodField()
    version = serializers.SerializerMethodField()
    error = serializers.JSONField(allow_null=True)
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()

    @extend_schema_field(UploadFileOutputSerializer(many=True))
    def get_files(self, obj: Upload) -> list[dict[str, Any]]:
        """Declared files without their S3 keys."""
        return [UploadFileOutputSerializer({**f, "parts": direct_upload.part_count(f["size"], obj.part_size)}).data
                for f in obj.files]

    def get_version(self, obj: Upload) -> int | None:
        """The version number this upload became, once ``done``."""
        return obj.version.number if obj.version_id and obj.version else None


class UploadCreatedSerializer(UploadOutputSerializer):
    """The create response: an upload plus ``part_urls``, presigned ``PUT`` URLs of each file's first 100 parts
    (``{file name: {part number: URL}}``), valid ``expires_in`` seconds; sign the rest, or expired ones, with
    ``sign``."""
    part_urls = serializers.DictField(child=serializers.DictField(child=serializers.CharField()))
    expires_in = serializers.IntegerField()


class UploadSignInputSerializer(serializers.Serializer):
    """Input of ``POST .../sign``: one file, and the part numbers to sign (at most 100)."""
    name = serializers.CharField(max_length=200)
    part_numbers = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=10_000),
                                         min_length=1, max_length=direct_upload.MAX_SIGN_BATCH)


class UploadSignOutputSerializer(serializers.Serializer):
    """Presigned ``PUT`` URLs by part number, valid ``expires_in`` seconds; each takes exactly its part's bytes."""
    urls = serializers.DictField(child=serializers.CharField())
    expires_in = serializers.IntegerField()


class UploadPartSerializer(serializers.Serializer):
    """A part S3 holds (or that the client uploaded): number and ETag; ``name`` (the file) and ``Size`` (bytes) in
    listings."""
    name = serializers.CharField(required=False)
    PartNumber = serializers.IntegerField(min_value=1, max_value=10_000)
    ETag = serializers.CharField(max_length=200)
    Size = serializers.IntegerField(required=False)


class UploadCompleteInputSerializer(serializers.Serializer):
    """Input of ``POST .../complete``: the file (or ``?name=``) and, optionally, the parts as uploaded."""
    name = serializers.CharField(max_length=200, required=False)
    parts = serializers.ListField(child=UploadPartSerializer(), required=False, max_length=10_000)


def _xml(body: str, code: int = 200) -> HttpResponse:
    return HttpResponse('<?xml version="1.0" encoding="UTF-8"?>' + body, content_type="application/xml", status=code)


class UploadViewSet(mixins.RetrieveModelMixin, TenantScopedViewSet):
    """Uploads of one adapter's new versions; another tenant's upload id is a 404 like any missing one."""

    queryset = Upload.objects.select_related("version").order_by("-created_at")
    serializer_class = UploadOutputSerializer
    lookup_field = "public_id"
    lookup_value_regex = "[0-9a-f]{32}"
    adapter_field = "adapter_name"
    parser_classes = [JSONParser, S3CompleteXmlParser]

    def tenant_queryset(self, queryset):  # type: ignore[no-untyped-def]
        """Uploads of the adapter named in the URL (already the caller's tenant's)."""
        return queryset.filter(adapter_name=self.kwargs["adapter_name"])

    @extend_schema(request=UploadCreateInputSerializer, responses={201: UploadCreatedSerializer})
    def create(self, request: Request, adapter_name: str) -> Response:
        """``POST``: declare the files (name, size, sha256); 201 with the S3 upload of each, ready for parts, and
        the URLs of their first parts."""
        self.adapter_in_reach(adapter_name)
        data = UploadCreateInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        upload = direct_upload.upload_create(self.tenant, adapter_name=adapter_name,
                                             base_model_name=data.validated_data["base_model"] or None,
                                             files=data.validated_data["files"])
        urls = direct_upload.upload_first_urls(upload)
        body = {**UploadOutputSerializer(upload).data, "expires_in": settings.QUIVER_UPLOAD_URL_EXPIRY_S,
                "part_urls": {name: {str(n): u for n, u in parts.items()} for name, parts in urls.items()}}
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=UploadSignInputSerializer, responses=UploadSignOutputSerializer)
    @action(detail=True, methods=["post"])
    def sign(self, request: Request, adapter_name: str, public_id: str) -> Response:
        """``POST .../sign``: presigned part URLs for one file."""
        data = UploadSignInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        urls = direct_upload.upload_sign_parts(self.get_object(), name=data.validated_data["name"],
                                               part_numbers=data.validated_data["part_numbers"])
        return Response({"urls": {str(n): u for n, u in urls.items()}, "expires_in": settings.QUIVER_UPLOAD_URL_EXPIRY_S})

    @extend_schema(parameters=[OpenApiParameter("name", str, description="one file; all files when omitted"),
                               OpenApiParameter("dialect", str, enum=["s3"])],
                   responses=UploadPartSerializer(many=True))
    @action(detail=True, methods=["get"])
    def parts(self, request: Request, adapter_name: str, public_id: str) -> Response | HttpResponse:
        """``GET .../parts?name=``: the parts S3 holds for a file, to resume after a dropped connection."""
        name = request.query_params.get("name") or None
        found = direct_upload.upload_list_parts(self.get_object(), name=name)
        if request.query_params.get("dialect") == "s3":
            items = "".join(f"<Part><PartNumber>{p['PartNumber']}</PartNumber><ETag>{escape(p['ETag'])}</ETag>"
                            f"<Size>{p['Size']}</Size></Part>" for p in found)
            return _xml(f"<ListPartsResult><Key>{escape(name or '')}</Key>{items}</ListPartsResult>")
        return Response(found)

    @extend_schema(request=UploadCompleteInputSerializer, responses=UploadOutputSerializer,
                   parameters=[OpenApiParameter("name", str), OpenApiParameter("dialect", str, enum=["s3"])])
    @action(detail=True, methods=["post"])
    def complete(self, request: Request, adapter_name: str, public_id: str) -> Response | HttpResponse:
        """``POST .../complete``: the server completes the file's multipart upload and checks its size; once every
        file is complete the upload is ``verifying`` (a worker checks sha256, then the version appears)."""
        data = UploadCompleteInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        name = data.validated_data.get("name") or request.query_params.get("name") or ""
        if not name:
            raise QuiverError("Name the file to complete ('name').", code="invalid",
                              fields={"name": ["This field is required."]})
        upload = direct_upload.upload_complete_file(self.get_object(), name=name,
                                                    parts=data.validated_data.get("parts"))
        if request.query_params.get("dialect") == "s3":
            return _xml(f"<CompleteMultipartUploadResult><Location>{escape(upload.public_id)}/{escape(name)}"
                        f"</Location><Bucket>quiver</Bucket><Key>{escape(name)}</Key>"
                        "</CompleteMultipartUploadResult>")
        return Response(UploadOutputSerializer(upload).data)

    @extend_schema(request=None, responses=UploadOutputSerializer)
    @action(detail=True, methods=["post", "delete"])
    def abort(self, request: Request, adapter_name: str, public_id: str) -> Response:
        """``POST .../abort`` (or ``DELETE``, as Uppy sends): cancel; S3 parts are aborted and objects deleted."""
        upload = direct_upload.upload_abort(self.get_object())
        if request.method == "DELETE":
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(UploadOutputSerializer(upload).data)
