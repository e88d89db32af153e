"""The demo's second half: console logins, light traffic on the demo adapters, and staying up until Ctrl-C."""

from __future__ import annotations

import itertools
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from openai import OpenAI

REPO = Path(__file__).resolve().parents[1]
# How often a kept-up demo looks for children that exited (and restarts them).
REVIVE_EVERY_S = 5.0


@dataclass(frozen=True)
class Login:
    """A console login the demo created: what it is for, its username and its (random, per run) password."""

    who: str
    username: str
    password: str


def create_logins(env: Mapping[str, str], tenant: str) -> list[Login]:
    """An operator (staff, sees every tenant) and an owner of ``tenant``, each with a fresh random password."""
    logins = [Login("operator (staff: every tenant, nodes and residency)", "operator", secrets.token_urlsafe(9)),
              Login(f"tenant user (owner of '{tenant}')", f"{tenant}-owner", secrets.token_urlsafe(9))]
    for login, extra in zip(logins, (["--staff"], ["--tenant", tenant, "--role", "owner"]), strict=True):
        subprocess.run([sys.executable, "manage.py", "quiver_user_create", login.username, *extra], cwd=REPO,
                       env={**env, "QUIVER_USER_PASSWORD": login.password}, check=True, capture_output=True)
    return logins


def traffic(client: OpenAI, examples: Mapping[str, Sequence[Mapping[str, str]]], stop: threading.Event,
            every_s: float = 4.0) -> None:
    """Ask the demo adapters their training prompts in turn, one short request every ``every_s`` seconds."""
    pairs = [(name, ex["prompt"]) for name in sorted(examples) for ex in examples[name]]
    for name, prompt in itertools.cycle(pairs):
        if stop.wait(every_s):
            return
        try:
            client.completions.create(model=name, prompt=prompt, max_tokens=4, temperature=0)
        except Exception:  # noqa: BLE001  (the demo keeps going; failures show in the console's error chart)
            continue


def serve_until_interrupted(web_url: str, logins: Sequence[Login], client: OpenAI,
                            examples: Mapping[str, Sequence[Mapping[str, str]]],
                            revive: Callable[[], list[str]] | None = None) -> None:
    """Print the console URL and logins, keep light traffic flowing, and return on Ctrl-C. Every
    ``REVIVE_EVERY_S`` ``revive`` restarts children that exited; what it says is printed."""
    print(f"\n== the console is up: {web_url} ==")
    print(f"  The README's examples: use {web_url} in place of http://localhost:8000")
    for login in logins:
        print(f"  {login.who:<52} username {login.username:<14} password {login.password}")
    print(f"  API key of the demo tenant (for curl and OpenAI clients): {client.api_key}")
    print("Press Ctrl-C to stop the stack.", flush=True)
    # Ctrl-C, and SIGTERM from a supervisor, both unwind through the caller's clean-up (a shell that started us in
    # the background may have left SIGINT ignored, hence the explicit handlers).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    stop = threading.Event()
    worker = threading.Thread(target=traffic, args=(client, examples, stop), name="demo-traffic", daemon=True)
    worker.start()
    try:
        while True:
            time.sleep(REVIVE_EVERY_S)
            for line in revive() if revive is not None else []:
                print(f"!! {line}", flush=True)
    except KeyboardInterrupt:
        print("\nstopping…", flush=True)
    finally:
        stop.set()
        worker.join(timeout=10)
