"""The worker processes' queues and beat schedule (conventions: named queues; tasks stay beside their services).

Task names are explicit and stable (each ``@shared_task(name=...)``): a running deployment's queued messages and
beat entries keep working across code moves. Names still read ``inference.gateway.tasks.*`` for the fleet and
metering tasks because that is where they lived when deployments first queued them.
``tests/test_architecture.py`` checks that every name here is a registered task.
"""

from __future__ import annotations

VALIDATE = "adapters_app.tasks.adapter_version_validate_task"
UPLOAD_VERIFY = "adapters_app.tasks.upload_verify_task"
VALIDATION_SWEEP = "adapters_app.tasks.validation_sweep_task"
PURGE_RUN = "adapters_app.tasks.purge_run_task"
PURGE_RECONCILE = "adapters_app.tasks.purge_reconcile_task"
GC_S3_ORPHANS = "adapters_app.tasks.gc_s3_orphans_task"
UPLOAD_SWEEP = "adapters_app.tasks.upload_sweep_task"
PLACEMENT_WARM = "inference.gateway.tasks.placement_warm_task"
PLACEMENT_EVICT = "inference.gateway.tasks.placement_evict_task"
FLEET_RECONCILE = "inference.gateway.tasks.fleet_reconcile_task"
NODE_MARK_STALE = "inference.gateway.tasks.node_mark_stale_task"
USAGE_DRAIN = "inference.gateway.tasks.usage_drain_task"
USAGE_ROLLUP = "inference.gateway.tasks.usage_rollup_task"
USAGE_RETENTION = "inference.gateway.tasks.usage_retention_task"

# The reconcile pass has a queue of its own, consumed by one worker process with one child (compose
# ``worker-reconcile``, Kubernetes ``Deployment/worker-reconcile``): its placement decision memoises HRW ranks
# (``inference.policy.placement``) in the process, and in a shared prefork pool each pass landed in a different
# child whose memo was cold (a first pass costs about twice a steady one: scripts/bench_fleet_view). Passes never
# overlap, and warms and evictions never wait behind one. Small stacks (the demo, tests) consume it with the rest.
RECONCILE_QUEUE = "reconcile"
RECONCILE_EXPIRES_S = 30.0  # one beat period: a pass still queued when the next is sent is dropped, not run twice

TASK_ROUTES: dict[str, dict[str, str]] = {
    VALIDATE: {"queue": "validation"},
    UPLOAD_VERIFY: {"queue": "validation"},
    PLACEMENT_WARM: {"queue": "placement"},
    PLACEMENT_EVICT: {"queue": "placement"},
    FLEET_RECONCILE: {"queue": RECONCILE_QUEUE},
}
# Every queue a worker must consume, for stacks that run one worker for all of them (the demo, tests, benches):
# Celery's default queue (beat's housekeeping) and every routed one.
ALL_QUEUES = ("celery", *sorted({route["queue"] for route in TASK_ROUTES.values()}))


def beat_schedule(*, validation_sweep_s: float) -> dict[str, dict[str, object]]:
    """Celery beat's schedule: ``{entry name: {"task": name, "schedule": seconds[, "options": apply_async's]}}``.

    Args:
        validation_sweep_s: seconds between sweeps for versions left ``uploaded`` (``QUIVER_SWEEP_INTERVAL_S``).
    """
    return {
        "node-mark-stale": {"task": NODE_MARK_STALE, "schedule": 15.0},
        "fleet-reconcile": {"task": FLEET_RECONCILE, "schedule": 30.0, "options": {"expires": RECONCILE_EXPIRES_S}},
        # Nothing stuck, nothing orphaned (adapters_app.purge).
        "validation-sweep": {"task": VALIDATION_SWEEP, "schedule": validation_sweep_s},
        "purge-reconcile": {"task": PURGE_RECONCILE, "schedule": 30.0},
        "gc-s3-orphans": {"task": GC_S3_ORPHANS, "schedule": 3600.0},
        "upload-sweep": {"task": UPLOAD_SWEEP, "schedule": 300.0},
        "usage-drain": {"task": USAGE_DRAIN, "schedule": 1.0},
        "usage-rollup": {"task": USAGE_ROLLUP, "schedule": 60.0},
        "usage-retention": {"task": USAGE_RETENTION, "schedule": 3600.0},
    }
