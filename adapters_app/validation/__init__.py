"""Adapter validator: a pure library (no Django, no network) over files and base-model facts.

Intake checks stop an upload before anything is stored (:func:`iter_archive`, :func:`extract_archive`,
:func:`check_upload_names`, all raising :class:`UploadRejected`); the gate :func:`validate_adapter_dir`
returns one :class:`ValidationReport` listing every problem of a stored adapter folder (issues 2 and 3).
"""

from __future__ import annotations

from adapters_app.validation.archive import ArchiveMember, extract_archive, iter_archive
from adapters_app.validation.base_model import BaseModelFacts, ModuleShape, PoolLimits
from adapters_app.validation.config import AdapterConfig, parse_config
from adapters_app.validation.intake import CONFIG_NAME, WEIGHTS_NAME, check_upload_names
from adapters_app.validation.problems import Problem, UploadRejected
from adapters_app.validation.report import ValidationReport
from adapters_app.validation.safetensors_header import SafetensorsHeader, TensorInfo, parse_header
from adapters_app.validation.validate import validate_adapter_dir

__all__ = [
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "AdapterConfig",
    "ArchiveMember",
    "BaseModelFacts",
    "ModuleShape",
    "PoolLimits",
    "Problem",
    "SafetensorsHeader",
    "TensorInfo",
    "UploadRejected",
    "ValidationReport",
    "check_upload_names",
    "extract_archive",
    "iter_archive",
    "parse_config",
    "parse_header",
    "validate_adapter_dir",
]
