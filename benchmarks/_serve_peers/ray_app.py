"""Ray Serve's peer: one deployment around the shared onnxruntime session, batched by
``@serve.batch``, behind Ray Serve's HTTP proxy.

Ray Serve speaks no v2 protocol, so the adapter is the smallest that lets ridgeline's v2
HTTP target (and so the same request bytes) drive it: ``GET /v2/health/ready``,
``GET /v2/models/NAME`` (the metadata) and ``GET /v2/models/NAME/ready``, and
``POST /v2/models/NAME/infer`` taking the v2 JSON body (the first input's ``data`` and
``shape``) and answering the v2 JSON reply. The body is parsed with orjson (as
ridgeline's and MLServer's front ends do), and the batch runs in a thread so that the
replica's event loop keeps parsing the next requests.

Run by ``benchmarks/serve.py`` with the peers' Python:
``python ray_app.py MODEL.onnx --name N --port P --batch B --delay-ms D --temp-dir DIR``;
it prints READY once the deployment answers and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading

import numpy as np
import orjson
import ray
from ray import serve
from session import open_session, run
from starlette.requests import Request
from starlette.responses import Response


def _json(doc: object, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def build(path: str, name: str, batch: int, delay_s: float) -> serve.Application:
    meta = {
        "name": name,
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "images", "datatype": "FP32", "shape": [-1, 3, 136, 136]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 1000]}],
    }

    @serve.deployment(
        num_replicas=1,
        ray_actor_options={"num_cpus": 1},
        max_ongoing_requests=1024,  # ≥ the batch size, or batches never fill
    )
    class Classifier:
        def __init__(self) -> None:
            self.session = open_session(path)

        @serve.batch(max_batch_size=batch, batch_wait_timeout_s=delay_s)
        async def infer(self, images: list[np.ndarray]) -> list[np.ndarray]:
            rows = [len(x) for x in images]
            logits = await asyncio.to_thread(run, self.session, np.concatenate(images))
            return np.split(logits, np.cumsum(rows)[:-1])

        async def __call__(self, request: Request) -> Response:
            path = request.url.path.rstrip("/")
            if request.method == "GET":
                if path == "/v2/health/ready":
                    return Response(status_code=200)
                if path == f"/v2/models/{name}":
                    return _json(meta)
                if path == f"/v2/models/{name}/ready":
                    return Response(status_code=200)
                return _json({"error": f"no route {path}"}, 404)
            if path != f"/v2/models/{name}/infer":
                return _json({"error": f"no route {path}"}, 404)
            doc = orjson.loads(await request.body())
            tensor = doc["inputs"][0]
            images = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
            logits = await self.infer(images)
            out = {"name": "logits", "datatype": "FP32", "shape": list(logits.shape)}
            out["data"] = logits.ravel().tolist()
            return _json({"model_name": name, "outputs": [out]})

    return Classifier.bind()  # type: ignore[attr-defined]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--name", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--delay-ms", type=float, required=True)
    p.add_argument("--temp-dir", required=True)
    args = p.parse_args()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=args.temp_dir,
        log_to_driver=False,
    )
    done = threading.Event()  # after ray.init, which installs handlers of its own
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        app = build(args.model, args.name, args.batch, args.delay_ms / 1000)
        serve.run(app, name=args.name, route_prefix="/")
        print("READY", flush=True)
        done.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    sys.exit(0)


if __name__ == "__main__":
    main()
