"""The quiver command: push adapters, promote / canary / roll back their versions, and manage keys and usage from a
terminal or a CI job.

Exit codes: 0 done (a push: the version is ready), 1 error (network, key, permission, not found, server),
2 bad command line, 3 the adapter failed validation (locally, before any upload, or on the server), 4 the server
refused the uploaded bytes, 5 still validating when ``--wait-timeout`` ran out, 130 interrupted (rerun a push to
resume). Errors are one line on stderr naming the problem and the fix; keys are never printed, except a new
key's secret by ``keys create``, once, as its purpose.
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rich.markup import escape

from quiver_client import config, render
from quiver_client.api import Client
from quiver_client.errors import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    ApiError,
    QuiverError,
    ValidationFailed,
)
from quiver_client.names import adapter_name_problem
from quiver_client.progress import for_terminal
from quiver_client.upload import push

_RELATIVE = re.compile(r"^(\d+)([mhdw])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def when(value: str) -> str:
    """``--since``/``--until``: ISO 8601, or a span back from now (``30m``, ``24h``, ``7d``, ``2w``) → ISO 8601."""
    match = _RELATIVE.match(value.strip())
    if match:
        moment = datetime.now(UTC) - timedelta(**{_UNITS[match[2]]: int(match[1])})
        return moment.isoformat(timespec="seconds")
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is neither ISO 8601 (2025-01-31T00:00:00Z) nor a span like 24h "
                                         "or 7d") from exc
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).isoformat(timespec="seconds")


def _name_at(value: str) -> tuple[str, int | None]:
    name, _, number = value.partition("@")
    if number and not number.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: write NAME@N with N a version number (e.g. support-bot@3)")
    return name, int(number) if number else None


def _adapter_name(value: str) -> str:
    """argparse's ``type`` for ``--name``: the server's naming rule, checked before any file is read (exit 2)."""
    problem = adapter_name_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def _client(args: argparse.Namespace) -> Client:
    return Client(getattr(args, "url", None), getattr(args, "api_key", None), timeout=getattr(args, "timeout", 60.0))


def cmd_login(args: argparse.Namespace) -> int:
    """Check a key against the server and store it (with the URL) in the config file, mode 0600."""
    url = args.url or os.environ.get("QUIVER_URL") or config.read_file().get("url")
    if not url:
        raise QuiverError("Pass the server: `quiver login --url https://quiver.example.com`.", code="not_configured")
    if args.api_key_stdin or not sys.stdin.isatty():
        key = sys.stdin.readline().strip()
    else:
        key = getpass.getpass("API key (qv_…, input hidden): ").strip()
    if not key:
        raise QuiverError("No key given; paste the key (qv_<id>.<secret>) the console or `quiver keys create` "
                          "showed.", code="no_key")
    with Client(url, key, timeout=args.timeout) as client:
        client.request("GET", "/api/v1/base-models")  # any valid key may list them: proves the key, nothing more
    path = config.write_file(url=url.rstrip("/"), api_key=key)
    render.err.print(f"Saved key {config.mask_key(key)} for {escape(url)} in {path} (mode 600).")
    return EXIT_OK


def cmd_logout(args: argparse.Namespace) -> int:
    """Remove the stored key (the URL stays)."""
    current = config.read_file()
    if current.get("api_key"):
        config.write_file(url=current.get("url", ""), api_key=None)
    render.err.print(f"No key stored in {config.config_path()} any more.")
    return EXIT_OK


def _rule(rule: Sequence[Mapping[str, Any]] | None) -> str:
    return " · ".join(f"v{e['version']} {e['weight']} %" for e in rule or []) or "nothing yet"


# A joining version's warm state (the API's ``warm``: adapters_app/serving.py) in words; ``no_node`` gets a sentence
# of its own with the fix (fresh-user round, issue 30: the CLI printed "v3 no_node").
WARM_WORDS = {"warm": "loaded", "cold": "still loading (its first requests wait for it)"}
NO_NODE_TEXT = ("No live node serves this adapter's base model yet, so {versions} cannot load and its requests get "
                "HTTP 503 no_capacity: wait for a node to come up (an operator starts one; `manage.py "
                "quiver_node_wait <node>` returns once it is live), then call it again; nothing needs redoing.")


def _serving_line(name: str, body: Mapping[str, Any]) -> str:
    """The human answer to a rule change: ``NAME: serving v2 90 % · v3 10 % since …; warmed first: v3 loaded``, and
    a second line with the fix when no node could take a joining version."""
    states = {str(v): str(state) for v, state in (body.get("warm") or {}).items()}
    warm = ", ".join(f"v{v} {WARM_WORDS.get(s, s)}" for v, s in states.items() if s != "no_node")
    since = f" since {body['serving_since']}" if body.get("serving_since") else " (unchanged)"
    line = f"{escape(name)}: serving {_rule(body.get('rule'))}{since}" + (f"; warmed first: {warm}" if warm else "")
    stranded = [f"v{v}" for v, s in states.items() if s == "no_node"]
    return line + ("\n" + NO_NODE_TEXT.format(versions=" and ".join(stranded)) if stranded else "")


def cmd_promote(args: argparse.Namespace) -> int:
    """All traffic to NAME@N (warmed on its nodes first)."""
    name, number = args.ref
    if number is None:
        raise QuiverError("Name the version: `quiver promote NAME@N`.", code="no_version")
    with _client(args) as client:
        body = client.promote(name, number)
    render.print_json(body) if args.json else render.out.print(_serving_line(name, body))
    return EXIT_OK


def cmd_canary(args: argparse.Namespace) -> int:
    """PCT % of NAME's traffic to version N beside the current primary; 0 ends the canary."""
    name, number = args.ref
    if number is None:
        raise QuiverError("Name the version: `quiver canary NAME@N PCT`.", code="no_version")
    with _client(args) as client:
        body = client.canary(name, number, args.percent)
    render.print_json(body) if args.json else render.out.print(_serving_line(name, body))
    return EXIT_OK


def cmd_rollback(args: argparse.Namespace) -> int:
    """Back to the serving rule before the last change."""
    with _client(args) as client:
        body = client.rollback(args.name)
    render.print_json(body) if args.json else render.out.print(_serving_line(args.name, body))
    return EXIT_OK


def _percent(value: str) -> int:
    if not value.isdigit() or not 0 <= int(value) <= 100:
        raise argparse.ArgumentTypeError(f"{value!r}: a whole percentage 0..100")
    return int(value)


def cmd_push(args: argparse.Namespace) -> int:
    """Validate locally, upload straight to S3 (resumable), wait for validation, print the report; with
    ``--promote``/``--canary PCT``, then send it traffic (warmed first). Files a version already holds (same
    sha256) are not uploaded again: the push answers with that version."""
    if (args.promote or args.canary is not None) and args.no_wait:
        raise QuiverError("--promote and --canary act once the version is ready; drop --no-wait.",
                          code="bad_arguments")
    reporter = for_terminal(quiet=args.json or args.quiet)
    with _client(args) as client:
        try:
            result = push(client, Path(args.path), name=args.name, base_model=args.base_model, parallel=args.parallel,
                          wait_validation=not args.no_wait, timeout=args.wait_timeout,
                          local_check_enabled=not args.no_local_check, reporter=reporter)
        except ValidationFailed as exc:
            if args.json:
                render.print_json({"adapter": args.name, "status": "rejected", "where": exc.where,
                                   "report": exc.report})
            else:
                render.err.print(f"[red]rejected[/red] ({exc.where} validation):")
                render.problems(exc.report, to_err=True)
            raise
        serving = None
        share = _share(client, args.name, result.version) if result.version is not None and \
            result.status == "ready" and not args.promote else None
        if result.version is not None and result.status == "ready" and args.promote:
            serving = client.promote(args.name, result.version)
        elif result.version is not None and result.status == "ready" and args.canary is not None and share != 100:
            # A first version already serves the name alone; the API refuses a canary of it (nothing to canary against).
            serving = client.canary(args.name, result.version, args.canary)
    if args.json:
        render.print_json({**result.to_dict(), **({"serving": serving} if serving is not None else {})})
        return EXIT_OK
    sent = f"{result.parts_sent} part(s) sent" + (f", {result.parts_skipped} already stored" if result.parts_skipped
                                                 else "")
    if result.version is None:
        render.out.print(f"{escape(args.name)}: uploaded ({sent}); the server is checking it (upload "
                         f"{result.upload_id}). See `quiver versions ls {args.name}`.")
        return EXIT_OK
    if result.existing:  # the same files as a version already there: no upload, no new version
        sent = "already uploaded: the same files, nothing sent"
    render.out.print(f"{escape(args.name)}@{result.version} [bold]{result.status}[/bold] ({sent}); sha256 "
                     f"{result.sha256}")
    if result.version_body:
        render.problems(result.version_body.get("validation_report"))
    if serving is not None:
        render.out.print(_serving_line(args.name, serving))
    if result.status == "ready" and serving is None:
        render.out.print(_reach_line(args.name, result.version, share, canary_skipped=args.canary is not None))
    return EXIT_OK


def _share(client: Client, name: str, number: int) -> int | None:
    """Version ``number``'s share (0..100) of ``model = name`` now, or None when the serving rule cannot be read."""
    try:
        rule = client.serving(name).get("rule") or []
    except ApiError:
        return None
    return next((int(e["weight"]) for e in rule if e.get("version") == number), 0)


def _reach_line(name: str, number: int, share: int | None, *, canary_skipped: bool) -> str:
    """What ``model = name`` reaches after a push that changed no rule: a first version serves it at once (the
    server's ``first_ready``), so the old "reaches what `quiver promote` / `quiver canary` set" misled there."""
    ref = f"model=\"{escape(name)}@{number}\""
    if share == 100:
        skipped = " (--canary skipped: there is no other version to canary it against)" if canary_skipped else ""
        return (f"Call it with model=\"{escape(name)}\" or {ref} now: the first ready version serves the name at "
                f"once{skipped}. Later versions take its traffic through `quiver promote` / `quiver canary`.")
    if share:
        return f"Call it with {ref} now; model=\"{escape(name)}\" sends it {share} % of its traffic."
    return (f"Call it with {ref} now; model=\"{escape(name)}\" keeps reaching the versions it served until "
            f"`quiver promote` / `quiver canary` sends it traffic.")


def cmd_adapters_ls(args: argparse.Namespace) -> int:
    """The tenant's adapters."""
    with _client(args) as client:
        rows = client.adapters()
    if args.json:
        render.print_json(rows)
        return EXIT_OK
    render.table(rows, [
        ("NAME", lambda r: r["name"]), ("BASE MODEL", lambda r: r["base_model"]),
        ("LATEST", lambda r: (f"v{r['latest_version']['number']} {r['latest_version']['status']}"
                              if r.get("latest_version") else None)),
        ("SERVING", lambda r: _rule(r.get("serving_rule")) if r.get("serving_rule") else (
            f"v{r['serving_version']}" if r.get("serving_version") else None)),
        ("RESIDENCY", lambda r: r.get("residency")), ("CREATED", lambda r: r.get("created_at"))],
        empty="No adapters yet; push one with `quiver push DIR --name NAME --base-model M`.")
    return EXIT_OK


def cmd_versions_ls(args: argparse.Namespace) -> int:
    """An adapter's versions, newest first."""
    with _client(args) as client:
        rows = client.versions(args.name)
    if args.json:
        render.print_json(rows)
        return EXIT_OK
    render.table(rows, [
        ("VERSION", lambda r: r["number"]), ("STATUS", lambda r: r["status"]),
        ("SIZE", lambda r: render.size(r.get("size_bytes"))), ("R", lambda r: r.get("r")),
        ("SHA256", lambda r: str(r.get("sha256"))[:12]), ("CREATED", lambda r: r.get("created_at"))],
        empty=f"{args.name} has no versions yet.")
    return EXIT_OK


def cmd_versions_show(args: argparse.Namespace) -> int:
    """One version (``NAME@N``; ``NAME`` alone: the newest) with its validation report."""
    name, number = args.ref
    with _client(args) as client:
        if number is None:
            versions = client.versions(name)
            if not versions:
                raise QuiverError(f"{name} has no versions yet; push one first.", code="no_versions")
            number = int(versions[0]["number"])
        body = client.version(name, number)
    if args.json:
        render.print_json(body)
    else:
        render.version(body)
    return EXIT_OK


def cmd_delete(args: argparse.Namespace) -> int:
    """Delete an adapter with its versions and stored files (asks first on a terminal unless ``--yes``)."""
    if not args.yes:
        if not sys.stdin.isatty():
            raise QuiverError(f"Deleting {args.name} removes every version; pass --yes to confirm in a script.",
                              code="confirm")
        if input(f"Delete adapter {args.name} and all its versions? [y/N] ").strip().lower() not in ("y", "yes"):
            render.err.print("Nothing deleted.")
            return EXIT_ERROR
    with _client(args) as client:
        client.adapter_delete(args.name)
    if args.json:
        render.print_json({"deleted": args.name})
    else:
        render.err.print(f"Deleted {escape(args.name)}.")
    return EXIT_OK


def cmd_keys_create(args: argparse.Namespace) -> int:
    """Mint a key: its secret is printed once (stdout: the key alone, or in ``--json``'s ``secret``)."""
    with _client(args) as client:
        key = client.key_create(args.name, scopes=args.scope, expires_at=args.expires, adapters=args.adapter)
    if args.json:
        render.print_json(key)
    else:
        only = f", only {', '.join(key['adapters'])}" if key.get("adapters") else ""
        render.err.print(f"Key {key['key_id']} ({escape(key['name'])}, scopes {', '.join(key['scopes'])}"
                         f"{escape(only)}); the secret is shown this once:")
        if key.get("warning"):  # adapters it names that do not exist yet (allowed: said, in case of a typo)
            render.err.print(f"[yellow]{escape(key['warning'])}[/yellow]")
        print(key["secret"], flush=True)
    return EXIT_OK


def cmd_keys_ls(args: argparse.Namespace) -> int:
    """The tenant's keys, masked."""
    with _client(args) as client:
        rows = client.keys()
    if args.json:
        render.print_json(rows)
        return EXIT_OK
    render.table(rows, [
        ("KEY ID", lambda r: r["key_id"]), ("KEY", lambda r: r["key"]), ("NAME", lambda r: r["name"]),
        ("SCOPES", lambda r: r["scopes"]), ("ADAPTERS", lambda r: r.get("adapters") or "all"),
        ("STATE", lambda r: "revoked" if r.get("revoked_at") else ("enabled" if r.get("enabled") else "disabled")),
        ("LAST USED", lambda r: r.get("last_used_at")), ("EXPIRES", lambda r: r.get("expires_at"))],
        empty="No keys.")
    return EXIT_OK


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    """Revoke a key for good."""
    with _client(args) as client:
        try:
            key = client.key_revoke(args.key_id)
        except ApiError as exc:
            if exc.status != 404:
                raise
            raise ApiError(f"No key {args.key_id!r} in this tenant; `quiver keys ls` lists the key ids.",
                           status=404, code=exc.code) from None
    if args.json:
        render.print_json(key)
    else:
        render.err.print(f"Revoked {escape(key['key_id'])} ({escape(key['name'])}).")
    return EXIT_OK


def cmd_usage(args: argparse.Namespace) -> int:
    """Requests and tokens per model and version (``--csv``: the raw records)."""
    with _client(args) as client:
        if args.csv:
            for chunk in client.usage_csv(since=args.since, until=args.until):
                sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
            return EXIT_OK
        rows = client.usage(since=args.since, until=args.until)
    if args.json:
        render.print_json(rows)
        return EXIT_OK
    render.table(rows, [
        ("MODEL", lambda r: r["model"]), ("VERSION", lambda r: r.get("version")),
        ("REQUESTS", lambda r: r["requests"]), ("PROMPT TOKENS", lambda r: r["prompt_tokens"]),
        ("COMPLETION TOKENS", lambda r: r["completion_tokens"])], empty="No usage in this range.")
    return EXIT_OK


def cmd_chat(args: argparse.Namespace) -> int:
    """One chat turn with an adapter (or a base model), streamed to stdout."""
    with _client(args) as client:
        if args.json:
            render.print_json(client.chat(args.name, args.prompt, max_tokens=args.max_tokens,
                                          temperature=args.temperature, system=args.system))
            return EXIT_OK
        for text in client.chat_stream(args.name, args.prompt, max_tokens=args.max_tokens,
                                       temperature=args.temperature, system=args.system):
            sys.stdout.write(text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    return EXIT_OK


def _common() -> argparse.ArgumentParser:
    """Options every command takes, before or after its name (defaults suppressed so either place works)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS, help="server base URL (env QUIVER_URL; config file)")
    common.add_argument("--api-key", default=argparse.SUPPRESS,
                        help="tenant key (prefer env QUIVER_API_KEY or `quiver login`: flags show in `ps`)")
    common.add_argument("--timeout", type=float, default=argparse.SUPPRESS, help="seconds per API request (60)")
    return common


def _json_flag() -> argparse.ArgumentParser:
    """``--json``, accepted before the command (``quiver --json adapters ls``) or after it; a default of SUPPRESS so
    a subcommand's parser does not overwrite the top level's value with False (``main`` fills it in)."""
    flag = argparse.ArgumentParser(add_help=False)
    flag.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                      help="print the API's JSON (for scripts)")
    return flag


def _plain(text: str) -> str:
    """The module docstring's reST for a terminal: ``--help`` printed the literal double backticks."""
    return text.replace("``", "`")


def parser() -> argparse.ArgumentParser:
    """The command line (``quiver --help``)."""
    common, json_flag = _common(), _json_flag()
    top = argparse.ArgumentParser(prog="quiver", parents=[common, json_flag], description=__doc__.split("\n\n")[0],
                                  epilog=_plain(__doc__.split("\n\n")[1]), formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def leaf(parent: Any, name: str, func: Any, help_text: str, *, takes_json: bool = True) -> argparse.ArgumentParser:
        parents = [common, json_flag] if takes_json else [common]
        p: argparse.ArgumentParser = parent.add_parser(name, parents=parents, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    p = leaf(sub, "login", cmd_login, "store a key for a server in the config file (mode 600)", takes_json=False)
    p.add_argument("--api-key-stdin", action="store_true", help="read the key from stdin (default: hidden prompt)")
    leaf(sub, "logout", cmd_logout, "remove the stored key", takes_json=False)

    p = leaf(sub, "push", cmd_push, "validate locally, upload straight to S3 (resumable), wait for validation")
    p.add_argument("path", help="PEFT adapter folder (adapter_config.json + adapter_model.safetensors) or .zip/.tar.gz")
    p.add_argument("--name", required=True, type=_adapter_name,
                   help="adapter name: what applications send as model (1-40 lowercase letters, digits, single hyphens)")
    p.add_argument("--base-model", help="registered base model (needed to create the adapter)")
    p.add_argument("--parallel", type=int, default=4, help="parts in flight at once (4)")
    p.add_argument("--no-wait", action="store_true", help="return once uploaded, without waiting for validation")
    p.add_argument("--wait-timeout", type=float, default=900.0, help="seconds to wait for validation (900)")
    p.add_argument("--no-local-check", action="store_true", help="skip the local validator (the server still checks)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--promote", action="store_true", help="once ready, send it all traffic (warmed first)")
    how.add_argument("--canary", type=_percent, metavar="PCT", help="once ready, send it PCT %% of traffic")

    p = leaf(sub, "promote", cmd_promote, "send all of an adapter's traffic to one version (warmed first)")
    p.add_argument("ref", type=_name_at, metavar="NAME@N", help="adapter and version")
    p = leaf(sub, "canary", cmd_canary, "send a share of an adapter's traffic to one version (sticky per user)")
    p.add_argument("ref", type=_name_at, metavar="NAME@N", help="adapter and version")
    p.add_argument("percent", type=_percent, metavar="PCT", help="share 0..100 (0 ends the canary)")
    leaf(sub, "rollback", cmd_rollback, "return to the serving rule before the last change").add_argument("name")

    adapters = sub.add_parser("adapters", help="adapters: ls").add_subparsers(dest="sub", metavar="ls", required=True)
    leaf(adapters, "ls", cmd_adapters_ls, "list the tenant's adapters")

    versions = sub.add_parser("versions", help="versions: ls NAME, show NAME@N").add_subparsers(
        dest="sub", metavar="{ls,show}", required=True)
    leaf(versions, "ls", cmd_versions_ls, "list an adapter's versions").add_argument("name")
    leaf(versions, "show", cmd_versions_show, "one version and its validation report").add_argument(
        "ref", type=_name_at, metavar="NAME@N", help="adapter and version (NAME alone: the newest)")

    p = leaf(sub, "delete", cmd_delete, "delete an adapter, its versions and stored files")
    p.add_argument("name")
    p.add_argument("--yes", action="store_true", help="do not ask (needed without a terminal)")

    keys = sub.add_parser("keys", help="keys: create, ls, revoke").add_subparsers(
        dest="sub", metavar="{create,ls,revoke}", required=True)
    p = leaf(keys, "create", cmd_keys_create, "mint a key (its secret is printed once)")
    p.add_argument("name")
    p.add_argument("--scope", action="append",
                   help="adapters:read, adapters:write, keys:manage, inference (repeat; default: all yours)")
    p.add_argument("--expires", type=when, help="expiry, ISO 8601")
    p.add_argument("--adapter", action="append",
                   help="only this adapter (NAME) or version (NAME@N) at the gateway (repeat; default: all)")
    leaf(keys, "ls", cmd_keys_ls, "list keys (masked)")
    leaf(keys, "revoke", cmd_keys_revoke, "revoke a key for good").add_argument("key_id")

    p = leaf(sub, "usage", cmd_usage, "requests and tokens per model and version")
    p.add_argument("--since", type=when, help="ISO 8601 or a span back from now: 30m, 24h, 7d")
    p.add_argument("--until", type=when, help="ISO 8601 or a span back from now (exclusive)")
    p.add_argument("--csv", action="store_true", help="the raw records as CSV on stdout")

    p = leaf(sub, "chat", cmd_chat, "one chat turn with an adapter, streamed")
    p.add_argument("name", help="adapter (or base model) name")
    p.add_argument("prompt")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--system", help="a system message first")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (see the module docstring). Never shows a traceback."""
    args = parser().parse_args(argv)
    if not hasattr(args, "timeout"):
        args.timeout = 60.0
    if not hasattr(args, "json"):
        args.json = False
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        again = " Rerun the same command to resume: parts already stored are not sent again." if (
            args.command == "push") else ""
        render.err.print(f"quiver: interrupted.{again}")
        return EXIT_INTERRUPTED
    except QuiverError as exc:
        prefix = f"quiver: error ({exc.code}): " if not isinstance(exc, ApiError) else (
            f"quiver: error ({exc.code}, HTTP {exc.status}): ")
        render.err.print(escape(prefix + " ".join(str(exc).split())))
        return exc.exit_code
    except BrokenPipeError:  # `quiver usage --csv | head`
        return EXIT_OK
    except OSError as exc:
        render.err.print(escape(f"quiver: error (os_error): {exc.strerror or type(exc).__name__}"
                                f"{f': {exc.filename}' if exc.filename else ''}; check the path and permissions."))
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
