"""Where the client finds its server and key: flags, then the environment, then the config file.

- ``QUIVER_URL`` / ``QUIVER_API_KEY`` (environment) override the file; ``--url`` / ``--api-key`` override both.
- The file is JSON ``{"url", "api_key"}`` at ``$QUIVER_CONFIG``, else ``$XDG_CONFIG_HOME/quiver/config.json``
  (``~/.config/quiver/config.json``). ``quiver login`` writes it with mode 0600 in a 0700 folder; a file that others
  can read is refused, as ssh refuses such a private key.
- Resumable uploads keep their state under ``$QUIVER_STATE_DIR``, else ``$XDG_STATE_HOME/quiver``
  (``~/.local/state/quiver``).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from quiver_client.errors import QuiverError


@dataclass(frozen=True)
class Settings:
    """The resolved server URL and key.

    Attributes:
        url: Base URL of the Quiver web service, without a trailing slash (``https://quiver.example.com``).
        api_key: The tenant key ``qv_<id>.<secret>``, or None when none is configured.
    """

    url: str
    api_key: str | None

    @property
    def masked_key(self) -> str:
        """The key's public id only (``qv_abc123.…``): what may be printed."""
        return mask_key(self.api_key)


def mask_key(key: str | None) -> str:
    """``qv_<id>.<secret>`` → ``qv_<id>.…``; anything else → ``…`` (never the secret)."""
    if not key:
        return "(none)"
    head, dot, _ = key.partition(".")
    return f"{head}.…" if dot and len(head) <= 40 else "…"


def config_path() -> Path:
    """The config file's path (it may not exist)."""
    if os.environ.get("QUIVER_CONFIG"):
        return Path(os.environ["QUIVER_CONFIG"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "quiver" / "config.json"


def state_dir() -> Path:
    """The folder of resumable uploads' state (created on first use by the uploader)."""
    if os.environ.get("QUIVER_STATE_DIR"):
        return Path(os.environ["QUIVER_STATE_DIR"]).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "quiver"


def read_file(path: Path | None = None) -> dict[str, str]:
    """The config file's ``{"url", "api_key"}`` (``{}`` when there is none).

    Raises:
        QuiverError: ``config_unsafe`` when group or others may read it, ``config_unreadable`` when it is not
            JSON; each names the fix.
    """
    path = path or config_path()
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return {}
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise QuiverError(f"{path} holds an API key but others may read it (mode {stat.S_IMODE(mode):03o}); run "
                          f"`chmod 600 {path}` or `quiver login` again.", code="config_unsafe")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise QuiverError(f"{path} is not a readable JSON config ({type(exc).__name__}); delete it and run "
                          "`quiver login` again.", code="config_unreadable") from exc
    if not isinstance(data, dict):
        raise QuiverError(f"{path} is not a JSON object; delete it and run `quiver login` again.",
                          code="config_unreadable")
    return {k: str(v) for k, v in data.items() if k in ("url", "api_key") and v}


def write_file(*, url: str, api_key: str | None, path: Path | None = None) -> Path:
    """Write the config file with mode 0600 (its folder 0700), replacing it atomically; returns its path."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)  # an existing tmp file keeps its old mode through O_CREAT
        json.dump({"url": url, **({"api_key": api_key} if api_key else {})}, out, indent=2)
        out.write("\n")
    os.replace(tmp, path)
    return path


def resolve(*, url: str | None = None, api_key: str | None = None, need_key: bool = True) -> Settings:
    """Settings from flags (``url``, ``api_key``), then ``QUIVER_URL``/``QUIVER_API_KEY``, then the config file.

    Raises:
        QuiverError: ``not_configured`` when no URL (or, with ``need_key``, no key) is found anywhere.
    """
    file: dict[str, str] = {}
    if not (url or os.environ.get("QUIVER_URL")) or (need_key and not (api_key or os.environ.get("QUIVER_API_KEY"))):
        file = read_file()
    found_url = url or os.environ.get("QUIVER_URL") or file.get("url")
    found_key = api_key or os.environ.get("QUIVER_API_KEY") or file.get("api_key")
    if not found_url:
        raise QuiverError("No Quiver server configured: pass --url, set QUIVER_URL, or run `quiver login --url URL`.",
                          code="not_configured")
    if need_key and not found_key:
        raise QuiverError("No API key configured: set QUIVER_API_KEY, or run `quiver login` (mint a key on the "
                          "console's Keys page or with `quiver keys create`).", code="not_configured")
    return Settings(url=found_url.rstrip("/"), api_key=found_key.strip() if found_key else None)
