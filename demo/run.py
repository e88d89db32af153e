"""The README's main job: the whole chain on embedded defaults, printed.

Starts SeaweedFS (pip), a SQLite-backed control plane served by uvicorn, a Celery worker on the serverless
``filesystem://`` broker, one CPU vLLM node and its agent; registers the tiny base model, creates a tenant and key,
uploads the demo adapters through the public REST API, waits until they are ready, then asks each adapter its
training prompts through the gateway with the official ``openai`` SDK and prints answers next to the expected ones.

Then, unless ``--once``, it starts Celery beat and keeps the stack and the web console up until Ctrl-C, printing the
console URL and two logins (an operator and a tenant owner), with light traffic on the demo adapters so the usage
charts move.

Exit status: 0 when every answer matches, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from openai import APIConnectionError, APIStatusError, OpenAI
from transformers.utils import logging as transformers_logging

from demo.api_client import upload_adapter, wait_validated
from demo.assets import ensure_demo_assets
from demo.console import create_logins, serve_until_interrupted
from devtools.frontend import ensure_console_built
from devtools.proc import free_port
from devtools.services import start_seaweedfs
from inference.node.launch import EngineConfig, engine_argv, engine_env
from workers import schedule

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
# The node (engine and agent) gets its own credentials, none of the control plane's secrets.
CONTROL_ONLY = ("DJANGO_SECRET_KEY", "QUIVER_API_KEY_HMAC_KEY", "QUIVER_NODE_SECRET", "DATABASE_URL")
# The control plane's S3 key: nodes never get it (nor any other).
S3_CREDENTIAL = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def web_argv(app: str, port: int) -> list[str]:
    """uvicorn serving one of Quiver's Django ASGI apps (``config.asgi``, ``config.internal_asgi``) as the demo runs it.

    Nothing stands in front of it, so ``X-Forwarded-For`` is never believed (``--no-proxy-headers``: uvicorn's
    default trusts it from 127.0.0.1, which let any local client pick the address login throttling counts), and
    request headers and bodies have read deadlines (``config.request_timeouts``: slow clients are cut).
    """
    return [PY, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
            "--no-proxy-headers", "--http", "config.request_timeouts:TimedHTTPProtocol"]


def node_process_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a node process (engine, agent) starts from: the demo's without :data:`CONTROL_ONLY` and with no
    S3 credential at all. A node reads adapter files only through the presigned GETs each load carries, so it can
    read nothing it was not asked to load, and write, list or delete nothing (docs/security.md)."""
    return {k: v for k, v in env.items() if k not in CONTROL_ONLY and k not in S3_CREDENTIAL}



NODE_NAME = "cpu-node-1"
# Tokens of each printed answer (the demo adapters' completions are a few tokens; greedy, so answers repeat).
ANSWER_TOKENS = 12
# One limit for every readiness wait: a cold start on a loaded 2-core machine imports Django for minutes.
START_TIMEOUT_S = float(os.environ.get("QUIVER_DEMO_START_TIMEOUT_S", "900"))


def _usage_settled(api: httpx.Client, *, at_least: int, timeout_s: float = 15.0) -> list[dict[str, Any]]:
    """``GET /api/v1/usage`` once it counts ``at_least`` requests and two reads agree (the gateway hands its records
    on in batches, ``inference.gateway.usage_sink``: a read right after the last answer missed it); what it says
    after ``timeout_s`` otherwise."""
    deadline, last = time.monotonic() + timeout_s, None
    while True:
        rows = api.get("/api/v1/usage").json()
        if (sum(r["requests"] for r in rows) >= at_least and rows == last) or time.monotonic() > deadline:
            return rows
        last = rows
        time.sleep(0.3)


def _say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Processes:
    """Child processes started with logs under one folder, stopped with SIGTERM (then SIGKILL) in reverse order."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._how: dict[str, tuple[list[str], dict[str, str]]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start ``argv`` with its output in ``<log_dir>/<name>.log`` (appended to, so a restart keeps the crash)."""
        with (self.log_dir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs = [(n, p) for n, p in self.procs if n != name] + [(name, proc)]
        self._how[name] = (argv, env)
        return proc

    def revive(self) -> list[str]:
        """Restart every child that exited, as a supervisor would; returns one line per restart naming the child, its
        exit code and its log (a dead Celery worker left a kept-up demo queuing uploads that nothing checked)."""
        lines = []
        for name, proc in list(self.procs):
            code = proc.poll()
            if code is None:
                continue
            argv, env = self._how[name]
            self.start(name, argv, env)
            lines.append(f"{name} exited with code {code}; restarted it (its log: {self.log_dir / (name + '.log')})")
        return lines

    def wait_http(self, name: str, url: str, timeout: float) -> None:
        """Wait until ``url`` answers 200; exit with the log tail if the process dies or ``timeout`` (s) passes."""
        proc = dict(self.procs)[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-3000:] or "(empty)"
        code = proc.poll()
        why = (
            f"exited with code {code}"
            if code is not None
            else f"was still starting after {timeout:.0f} s (raise QUIVER_DEMO_START_TIMEOUT_S on a slow machine)"
        )
        raise SystemExit(f"{name} {why}; it never answered {url}. Log {self.log_dir / (name + '.log')}:\n{tail}")

    def stop_all(self) -> None:
        """SIGTERM every child (newest first), then SIGKILL any still alive after 15 s."""
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


# What an operator's `manage.py` needs to act on the running demo (README "Using it").
DEMO_ENV_KEYS = ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CELERY_BROKER_URL", "CELERY_FILESYSTEM_DIR",
                 "AWS_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_STORAGE_BUCKET_NAME",
                 "QUIVER_NODE_SECRET", "DJANGO_SECRET_KEY", "QUIVER_API_KEY_HMAC_KEY", "QUIVER_NODE_STALE_AFTER_S",
                 "DJANGO_DEBUG")


def _write_env(path: Path, env: dict[str, str]) -> None:
    """The demo's control-plane environment as ``KEY='value'`` lines (owner-only: it holds the run's secrets), so
    ``set -a; . .cache/demo-run/env; set +a`` lets ``manage.py`` act on the running demo."""
    path.touch(mode=0o600)
    path.write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items() if k in DEMO_ENV_KEYS))


def _fresh_workdir(path: Path) -> None:
    """Empty ``path`` and make it anew, owner-only (0700), with its ``logs`` folder. Everything the run keeps lies
    under it: the SQLite database (Django's session keys are the cookies themselves, key digests), every tenant's
    adapter files in the S3 server's folder, the node's staged copies, the logs. It was world-readable (0755, files
    0644), so any local user could read the operator's session cookie and take over the console (attack round);
    the env file alone was owner-only."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, mode=0o700)
    path.chmod(0o700)  # mkdir's mode is masked by the umask; and a parent made by parents=True is not this folder
    (path / "logs").mkdir()


def _manage(env: dict[str, str], *args: str) -> str:
    out = subprocess.run(
        [PY, "manage.py", *args], cwd=REPO, env=env, check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def _wait_node_live(env: dict[str, str], node_name: str, timeout: float = START_TIMEOUT_S) -> None:
    """Wait until node ``node_name`` is live as the gateway counts it (healthy, a fresh heartbeat), reading its row
    (``manage.py quiver_node_wait``); exit with that command's reason after ``timeout`` seconds.

    It probed the gateway with the demo tenant's key instead, so every 503 while the node warmed up was metered as
    one of the tenant's errors on its Usage page."""
    try:
        _manage(env, "quiver_node_wait", node_name, "--timeout", str(timeout))
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"no node reported itself live: {exc.stderr.strip() or exc.stdout.strip()}") from exc


def _first_answer(client: OpenAI, base_model: str, prompt: str) -> dict[tuple[str, str], str]:
    """The base model's answer to ``prompt`` through the gateway, once the node is live: exit with the gateway's
    answer when it fails (nothing later would work either).

    It is one of the printed questions, asked early, not a request of its own: a probe with the demo tenant's key
    was metered as the tenant's usage (``tiny-llama (base) requests=31`` after 30 questions).

    Returns:
        ``{(base_model, prompt): text}``, for :func:`_ask` to answer that question from.
    """
    try:
        return {(base_model, prompt): _ask(client, {}, base_model, prompt)}
    except APIStatusError as exc:
        raise SystemExit(f"the gateway's first answer for {base_model} was HTTP {exc.status_code}: "
                         f"{exc.response.text[:500]}") from exc
    except APIConnectionError as exc:
        raise SystemExit(f"the gateway did not answer the first question for {base_model}: {exc}") from exc


def _ask(client: OpenAI, asked: dict[tuple[str, str], str], model: str, prompt: str) -> str:
    """``model``'s completion of ``prompt`` (greedy, ``ANSWER_TOKENS`` tokens): from ``asked`` when it holds that
    question (taken out, so it is reused once), else from the gateway."""
    if (model, prompt) in asked:
        return asked.pop((model, prompt))
    out = client.completions.create(model=model, prompt=prompt, max_tokens=ANSWER_TOKENS, temperature=0)
    return out.choices[0].text


def _ask_examples(client: OpenAI, asked: dict[tuple[str, str], str], examples: Mapping[str, list[dict[str, str]]],
                  base_model: str) -> tuple[int, int]:
    """Ask each adapter its training prompts, and the base model the same, printing a table per adapter.

    Args:
        asked: answers already fetched (:func:`_first_answer`), used instead of asking again.
        examples: per adapter name, ``{"prompt", "completion"}`` pairs.

    Returns:
        ``(failures, total)``: answers that differ from the expected completion, and questions asked per model.
    """
    failures = total = 0
    for name in sorted(examples):
        print(f"\n== adapter {name!r} (served through the gateway by vLLM) ==")
        print(f"{'prompt':<16} {'expected':<14} {'adapter says':<14} {'base model says':<18} ok")
        for example in examples[name]:
            answers = [_ask(client, asked, model, example["prompt"]) for model in (name, base_model)]
            ok = answers[0].strip() == example["completion"].strip()
            failures += not ok
            total += 1
            print(
                f"{example['prompt']!r:<16} {example['completion']!r:<14} {answers[0]!r:<14} "
                f"{answers[1][:16]!r:<18} {'yes' if ok else 'NO'}"
            )
    return failures, total


def main(argv: list[str] | None = None) -> int:
    """Run the demo; see the module docstring. Returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assets", type=Path, default=REPO / ".cache" / "demo-assets")
    parser.add_argument("--workdir", type=Path, default=REPO / ".cache" / "demo-run")
    parser.add_argument("--once", action="store_true",
                        help="exit after the printed check instead of keeping the stack and console up (CI)")
    args = parser.parse_args(argv)

    started = time.monotonic()
    transformers_logging.disable_progress_bar()  # keep the printed run readable
    _say("building the tiny base model and training the demo adapters (cached after the first run)")
    assets = ensure_demo_assets(args.assets)
    if not args.once:
        ensure_console_built(say=_say)  # says so itself, once, when it builds (nothing when up to date)
    _fresh_workdir(args.workdir)
    procs = Processes(args.workdir / "logs")
    with ExitStack() as stack:
        stack.callback(procs.stop_all)
        s3 = start_seaweedfs(args.workdir / "s3", bucket="quiver")
        stack.callback(s3.stop)
        web_port, internal_port, agent_port, engine_port = free_port(), free_port(), free_port(), free_port()
        web_url = f"http://127.0.0.1:{web_port}"
        agent_url, engine_url = f"http://127.0.0.1:{agent_port}", f"http://127.0.0.1:{engine_port}"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings.local",
            "DATABASE_URL": f"sqlite:///{args.workdir / 'quiver.sqlite3'}",
            "CELERY_BROKER_URL": "filesystem://",
            "CELERY_FILESYSTEM_DIR": str(args.workdir / "broker"),
            "AWS_S3_ENDPOINT_URL": s3.endpoint_url,
            "AWS_ACCESS_KEY_ID": s3.access_key,
            "AWS_SECRET_ACCESS_KEY": s3.secret_key,
            "AWS_STORAGE_BUCKET_NAME": s3.bucket,
            "QUIVER_NODE_SECRET": secrets.token_urlsafe(32),
            # Local settings would fall back to development secrets; the demo chooses fresh ones explicitly.
            "DJANGO_SECRET_KEY": secrets.token_urlsafe(48),
            "QUIVER_API_KEY_HMAC_KEY": secrets.token_urlsafe(32),
            "QUIVER_NODE_STALE_AFTER_S": "30",
            # Its stack faces a browser and clients like a deployment: JSON errors, not Django's debug pages (which
            # list every URL pattern and echo request data).
            "DJANGO_DEBUG": "false",
        }
        for d in ("broker", "broker-done", "broker-control", "metrics"):
            (args.workdir / d).mkdir()
        _write_env(args.workdir / "env", env)
        # The gateway's metrics reach the internal listener's /metrics through prometheus-client's multiprocess files.
        web_env = {**env, "PROMETHEUS_MULTIPROC_DIR": str(args.workdir / "metrics")}
        _say("migrating the SQLite database and registering the base model")
        _manage(env, "migrate", "--noinput")
        _manage(
            env,
            "quiver_base_model_register",
            assets.served_name,
            str(assets.base_dir),
            "--max-lora-rank",
            "16",
        )
        api_key = _manage(env, "quiver_tenant_create", "demo", "--name", "Demo Tenant").splitlines()[-1]
        # The operator registers the node with its URLs; the node gets its own key and heartbeat token.
        node_env = dict(line.split("=", 1) for line in _manage(
            env, "quiver_node_register", NODE_NAME, "--agent-url", agent_url, "--engine-url", engine_url,
            "--base-model", assets.served_name).splitlines())
        node_key = node_env["QUIVER_NODE_KEY"]

        engine = EngineConfig.cpu_dev(assets.base_dir, assets.served_name, port=engine_port, api_key=node_key)
        _say("starting the vLLM CPU node (about 30 s on a quiet machine, minutes on a busy one), the gateway and its internal listener, the worker and the "
             "node agent")
        procs.start("vllm", engine_argv(engine, python=PY), engine_env(engine, node_process_env(env)))
        procs.start("web", web_argv("config.asgi:application", web_port), web_env)
        procs.start("web-internal", web_argv("config.internal_asgi:application", internal_port), web_env)
        procs.start(
            "worker",
            [
                PY,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "--pool=threads",
                "--concurrency=4",
                "-Q",
                ",".join(schedule.ALL_QUEUES),
                "--loglevel=WARNING",
            ],
            env,
        )
        agent_env = {
            **node_process_env(env),
            **node_env,
            "QUIVER_ENGINE_URL": engine_url,
            "QUIVER_BASE_MODEL": assets.served_name,
            "QUIVER_NODE_CACHE_DIR": str(args.workdir / "node-cache"),
            "QUIVER_AGENT_URL": agent_url,
            "QUIVER_CONTROL_URL": f"http://127.0.0.1:{internal_port}",
            "QUIVER_HEARTBEAT_SECONDS": "2",
            "QUIVER_MAX_LORAS": "2",
            "QUIVER_MAX_CPU_LORAS": "4",
            "QUIVER_MAX_LORA_RANK": "16",
        }
        procs.start(
            "agent",
            [
                PY,
                "-m",
                "uvicorn",
                "inference.node.agent:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(agent_port),
                "--log-level",
                "warning",
            ],
            agent_env,
        )
        procs.wait_http("web", web_url + "/healthz", START_TIMEOUT_S)
        procs.wait_http("web-internal", f"http://127.0.0.1:{internal_port}/healthz", START_TIMEOUT_S)
        procs.wait_http("vllm", f"http://127.0.0.1:{engine_port}/health", START_TIMEOUT_S)
        procs.wait_http("agent", f"http://127.0.0.1:{agent_port}/healthz", START_TIMEOUT_S)

        api = stack.enter_context(
            httpx.Client(base_url=web_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=120)
        )
        _wait_node_live(env, NODE_NAME)
        client = OpenAI(base_url=web_url + "/v1", api_key=api_key, max_retries=0, timeout=180)
        first_prompt = assets.examples[sorted(assets.examples)[0]][0]["prompt"]
        asked = _first_answer(client, assets.served_name, first_prompt)
        for name, folder in sorted(assets.adapters.items()):
            number = upload_adapter(api, name, folder, base_model=assets.served_name)["number"]
            version = wait_validated(api, name, number)
            _say(
                f"uploaded {name} v{number}: {version['status']} (r={version['r']}, "
                f"lora_alpha={version['lora_alpha']}, sha256={version['sha256'][:12]}…)"
            )
            if version["status"] != "ready":
                print(json.dumps(version["validation_report"], indent=2))
                return 1

        _say("models visible to the tenant: " + ", ".join(m.id for m in client.models.list().data))
        failures, total = _ask_examples(client, asked, assets.examples, assets.served_name)
        print("\n(the base model is untrained random weights: its answers are noise; each adapter learned its task)")
        print("\n== usage metered by the gateway (GET /api/v1/usage) ==")
        for row in _usage_settled(api, at_least=2 * total):
            print(f"{row['model']:<12} {'v' + str(row['version']) if row['version'] else '(base)':<6} "
                  f"requests={row['requests']:<3} "
                  f"prompt_tokens={row['prompt_tokens']:<4} completion_tokens={row['completion_tokens']}")
        _say(f"{total - failures}/{total} answers match; total {time.monotonic() - started:.0f} s")
        if args.once:
            print("Run ./scripts/demo without --once to keep the stack up and open the web console.")
        else:
            # Celery beat, as production runs it (workers/schedule.py): its sweeps revalidate a version whose task a
            # killed worker lost (it stayed "validating" here), and rollups and retention run. Started after the
            # check, so the printed run is the same as under --once.
            procs.start("beat", [PY, "-m", "celery", "-A", "config", "beat", "--loglevel=WARNING",
                                 "--schedule", str(args.workdir / "celerybeat-schedule")], env)
            logins = create_logins(env, "demo")
            serve_until_interrupted(web_url, logins, client, assets.examples, revive=procs.revive)
        return 0 if failures == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
