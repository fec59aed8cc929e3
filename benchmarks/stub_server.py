"""A minimal Open Inference Protocol v2 stub (aiohttp, uvloop): ready, metadata, and an
infer route that reads the body and answers a fixed output. No batching, no metrics,
no validation: so cheap that the load generator, not the server, is what a benchmark
against it measures. Usage: python benchmarks/stub_server.py PORT
"""

from __future__ import annotations

import json
import sys

import uvloop
from aiohttp import web

META = json.dumps(
    {
        "name": "fake",
        "versions": ["1"],
        "platform": "stub",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]}],
    }
)
ANSWER = json.dumps(
    {
        "model_name": "fake",
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}],
    }
).encode()


async def infer(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=ANSWER, content_type="application/json")


async def ready(request: web.Request) -> web.Response:
    return web.Response(text="")


async def metadata(request: web.Request) -> web.Response:
    return web.Response(text=META, content_type="application/json")


def main() -> None:
    app = web.Application()
    app.router.add_post("/v2/models/fake/infer", infer)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2/models/fake", metadata)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()
