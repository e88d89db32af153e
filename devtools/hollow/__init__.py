"""Emulated vLLM engines ("hollow nodes", after Kubernetes' kubemark) for scale runs of the real control plane.

A development tool only: the product's acceptance tests of serving run on real vLLM engines. ``engine`` holds the
state and the scheduler, ``costs`` the two calibrations of its clock, ``openai_api`` and ``app`` the HTTP routes
the node agent and the gateway use, ``host`` many emulated nodes (engine + real agent) in one process.
"""
