"""The node agent's engine scrape (``inference.node.load_publisher``, ten times a second on every node): CPU per
scrape of the agent's two HTTP clients against the same server and body, side by side in one run.

- ``httpx``: ``EngineHTTPClient.metrics_text`` (the agent's httpx client, the scrape's client before);
- ``aiohttp``: ``EngineScraper.metrics_text`` (``inference.node.engine_scrape``, the scrape's client now).

The server is a separate process (aiohttp) answering ``/metrics`` with a body recorded from a real vLLM 0.32 CPU
engine (``tests/inference/node/data/metrics_inflight.txt``, 52 KB); the figure is the client process's CPU time
(user + system) per scrape including ``scan_load``, in alternating blocks so both share the machine's load.

Usage:
    .venv/bin/python scripts/bench_scrape.py [--scrapes 2000] [--blocks 6]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BODY = (REPO / "tests/inference/node/data/metrics_inflight.txt").read_bytes()


def _serve(port: int) -> None:
    from aiohttp import web

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=BODY, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


async def _run(port: int, scrapes: int, blocks: int) -> dict[str, list[float]]:
    import httpx

    from inference.node.engine_client import EngineHTTPClient
    from inference.node.engine_scrape import EngineScraper
    from inference.node.load_publisher import scan_load

    url = f"http://127.0.0.1:{port}"
    out: dict[str, list[float]] = {"httpx": [], "aiohttp": []}
    async with httpx.AsyncClient(base_url=url) as http, EngineScraper(url, "key") as scraper:
        clients = {"httpx": EngineHTTPClient(http, "key").metrics_text, "aiohttp": scraper.metrics_text}
        for read in clients.values():  # connections open, first-call costs paid
            for _ in range(50):
                scan_load(await read(), at_s=0.0)
        for block in range(blocks):
            for name in (("httpx", "aiohttp") if block % 2 == 0 else ("aiohttp", "httpx")):
                cpu = time.process_time()
                for _ in range(scrapes):
                    load = scan_load(await clients[name](), at_s=0.0)
                out[name].append((time.process_time() - cpu) / scrapes * 1000)
                assert load.num_requests_running >= 0
    return out


def main(argv: list[str] | None = None) -> int:
    """Print CPU ms per scrape for both clients; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scrapes", type=int, default=2000, help="scrapes per block")
    parser.add_argument("--blocks", type=int, default=6, help="blocks, alternating which client goes first")
    args = parser.parse_args(argv)
    from devtools.proc import free_port

    port = free_port()
    server = multiprocessing.Process(target=_serve, args=(port,), daemon=True)
    server.start()
    try:
        import httpx

        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        figures = asyncio.run(_run(port, args.scrapes, args.blocks))
    finally:
        server.terminate()
    print(f"engine scrape, {len(BODY):,}-byte vLLM /metrics body, {args.blocks} blocks x {args.scrapes} scrapes; "
          f"cores: {os.cpu_count()}; load avg: {os.getloadavg()[0]:.2f}")
    print(f"{'client':10} {'CPU ms/scrape p50':>18} {'min':>7} {'max':>7} {'cores at 10/s x 64 nodes':>26}")
    for name, values in figures.items():
        p50 = statistics.median(values)
        print(f"{name:10} {p50:18.3f} {min(values):7.3f} {max(values):7.3f} {p50 / 1000 * 10 * 64:26.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
