"""Quiver's Python client and ``quiver`` command.

>>> from quiver_client import Client
>>> with Client() as quiver:  # QUIVER_URL / QUIVER_API_KEY, or the file `quiver login` wrote
...     result = quiver.push("out/adapter", name="support-bot", base_model="tiny-llama")
...     print(result.version, result.status)
"""

from quiver_client.api import Client
from quiver_client.errors import ApiError, QuiverError, ValidationFailed
from quiver_client.upload import PushResult, push

__all__ = ["ApiError", "Client", "PushResult", "QuiverError", "ValidationFailed", "push"]
__version__ = "0.1.0"
