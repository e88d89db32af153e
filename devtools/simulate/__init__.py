"""Discrete-event simulator of adapter residency across a fleet (``./scripts/simulate``; docs/placement.md).

It runs the production decisions of ``inference.policy`` (imported, not copied) against baselines, over synthetic
workloads (Zipf, S-LoRA's power draw, on/off tenants, drift, new versions arriving), with tier load times from a
documented cost model (``costs``).
"""
