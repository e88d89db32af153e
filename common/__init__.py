"""The ground floor every app may import: the error envelope, request parsers, echo clipping, Redis clients.

Nothing here defines models or imports an app of ours (pyproject [tool.importlinter]).
"""
