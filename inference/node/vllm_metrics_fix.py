"""Keep vLLM's ``vllm:lora_requests_info`` gauge to one series (the current running and waiting adapters).

vLLM 0.32 sets the gauge with ``labels(running_lora_adapters=…, waiting_lora_adapters=…).set_to_current_time()``
on every logged step (``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger.record``) and never removes a label set:
each distinct combination (order included) stays a series forever, so ``/metrics`` grows with every mix of adapters
a long-lived engine has batched, and the agent reads it every 100 ms (``inference.node.load_publisher``). Readers
already take the newest series as the current one (``inference.node.metrics``), so keeping only that series changes
no reading. Applied in the API server process by ``inference.node.serve`` before vLLM builds its stat loggers.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

logger = logging.getLogger("vllm.plugins.quiver_metrics_fix")
_MARKER = "__quiver_single_lora_series__"


def single_series(gauge: Any) -> Any:
    """Make ``gauge.labels(...)`` drop every other label set first (idempotent); returns ``gauge``.

    Args:
        gauge: a labelled ``prometheus_client`` metric (anything with ``labels`` and ``clear``).
    """
    if getattr(gauge, _MARKER, False):
        return gauge
    labels = gauge.labels

    @functools.wraps(labels)
    def labels_alone(*args: Any, **kwargs: Any) -> Any:
        gauge.clear()
        return labels(*args, **kwargs)

    gauge.labels = labels_alone
    setattr(gauge, _MARKER, True)
    return gauge


def install() -> bool:
    """Patch ``PrometheusStatLogger`` so its LoRA info gauge keeps one series (idempotent).

    Returns:
        True when patched (now or before), False when this vLLM has no such logger (nothing to fix).
    """
    try:
        from vllm.v1.metrics.loggers import PrometheusStatLogger
    except ImportError:
        return False
    if getattr(PrometheusStatLogger, _MARKER, False):
        return True
    init = PrometheusStatLogger.__init__

    @functools.wraps(init)
    def patched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        gauge = getattr(self, "gauge_lora_info", None)
        if gauge is not None:
            single_series(gauge)

    PrometheusStatLogger.__init__ = patched_init  # type: ignore[method-assign]
    setattr(PrometheusStatLogger, _MARKER, True)
    return True
