"""A ridgeline Plan as a Ray Serve application: the module ``ridgeline export ray-serve``
copies beside its ``serve_config.yaml`` (as ``ridgeline_serve_app.py``).

Self-contained on purpose: it imports Ray Serve, Starlette, NumPy, onnxruntime and
orjson, and the graph's glue from ``ridgeline_glue.py`` (``policies/glue.py``, copied
beside it), never the rest of ridgeline, so a Ray cluster without ridgeline runs it.
``build(args)`` is Serve's application builder (``import_path:
ridgeline_serve_app:build``); ``args`` is what the exporter writes: the plan's name,
each task's model and batching, the edges.

* One deployment per task: ``OnnxTask`` (an onnxruntime session with the segment's
  threads) or ``SyntheticTask`` (sleeps ``base_ms + per_item_ms·rows``, answers
  2·input). Each batches with ``@serve.batch``, counting rows, not requests, as the
  runtime does; its ``max_batch_size`` and ``batch_wait_timeout_s`` come from the
  deployment's ``user_config`` (``reconfigure``), so an operator changes them without a
  redeploy.
* The ingress, ``Pipeline``, speaks the Open Inference Protocol v2 over HTTP (health,
  metadata, JSON infer): the pipeline as a model named after the plan, each task as a
  model of its own. It composes the graph with deployment handles as
  ``ridgeline.serve.graph`` does: a request's rows split into chunks of at most the
  task's batch size, each edge turning a parent's rows into ``rows × factor`` child rows
  (the fraction carried to the next request), the child's input a deterministic
  reshaping of the parent's outputs (``adapt``; both from ``policies/glue.py``), the
  answer every sink task's outputs named ``TASK.OUTPUT``.

Not carried over from the runtime: early dropping (a request runs to the end however
late) and per-task latency budgets; a full queue answers 503.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

try:  # the exporter copies policies/glue.py beside this file
    from ridgeline_glue import adapt, fan_out  # type: ignore[import-not-found]
except ImportError:  # imported from the package (ridgeline serve --engine ray)
    from ridgeline.policies.glue import adapt, fan_out

try:
    import orjson

    def _dumps(doc: object) -> bytes:
        return orjson.dumps(doc)

    def _loads(body: bytes) -> Any:
        return orjson.loads(body)

except ImportError:  # pragma: no cover - orjson is in Ray Serve's own dependencies
    import json

    def _dumps(doc: object) -> bytes:
        return json.dumps(doc, separators=(",", ":")).encode()

    def _loads(body: bytes) -> Any:
        return json.loads(body)


Array = np.ndarray[Any, Any]
Spec = dict[str, Any]
"""A tensor declaration as v2 metadata writes it: ``{name, datatype, shape}``."""

DTYPES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}
"""The v2 datatypes this application carries (no BYTES, no BF16), as NumPy dtypes."""

_ORT_TYPES = {f"tensor({np.dtype(d).name})": t for t, d in DTYPES.items()}
_ORT_TYPES["tensor(float)"], _ORT_TYPES["tensor(double)"] = "FP32", "FP64"


class BadRequest(ValueError):
    """A request this application cannot answer: 400, with the reason."""


# --- the tasks -----------------------------------------------------------------------


def _rows(items: list[list[Array]]) -> int:
    """A batch's size in rows (``@serve.batch``'s ``batch_size_fn``)."""
    return sum(int(arrays[0].shape[0]) for arrays in items)


class _Batched:
    """What both task kinds share: batching over rows, set from ``user_config``."""

    spec: dict[str, Any]

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.reconfigure(
            {
                "max_batch_size": spec["batch_size"],
                "batch_wait_timeout_s": spec["max_queue_delay_ms"] / 1000.0,
            }
        )

    def reconfigure(self, config: dict[str, Any]) -> None:
        """Serve calls this with the deployment's ``user_config``."""
        batched: Any = self.batch
        batched.set_max_batch_size(int(config["max_batch_size"]))
        batched.set_batch_wait_timeout_s(float(config["batch_wait_timeout_s"]))

    @serve.batch(max_batch_size=1, batch_wait_timeout_s=0.0, batch_size_fn=_rows)
    async def batch(self, items: list[list[Array]]) -> list[list[Array]]:
        sizes = [int(arrays[0].shape[0]) for arrays in items]
        joined = [np.concatenate([a[k] for a in items]) for k in range(len(items[0]))]
        outputs = await self.run(joined)
        cuts = np.cumsum(sizes)[:-1]
        split = [np.split(o, cuts) for o in outputs]
        return [[parts[i] for parts in split] for i in range(len(items))]

    async def infer(self, arrays: list[Array]) -> list[Array]:
        """One request's rows (at most ``max_batch_size``), batched with others."""
        answer: list[Array] = await self.batch(arrays)
        return answer

    async def run(self, arrays: list[Array]) -> list[Array]:
        raise NotImplementedError

    def signature(self) -> dict[str, list[Spec]]:
        raise NotImplementedError


@serve.deployment
class OnnxTask(_Batched):
    """A task's ONNX model in an onnxruntime session with its segment's threads."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = int(spec["threads"])
        options.inter_op_num_threads = 1
        providers = ["CPUExecutionProvider"]
        if spec["device"] == "cuda":
            providers.insert(0, "CUDAExecutionProvider")
        self.session = ort.InferenceSession(
            os.path.abspath(spec["path"]), options, providers=providers
        )
        self.outputs = [o.name for o in self.session.get_outputs()]
        super().__init__(spec)

    async def run(self, arrays: list[Array]) -> list[Array]:
        feed = {i.name: a for i, a in zip(self.session.get_inputs(), arrays, strict=True)}
        # in a thread: the replica's event loop keeps taking the next requests
        out: list[Array] = await asyncio.to_thread(self.session.run, self.outputs, feed)
        return out

    def signature(self) -> dict[str, list[Spec]]:
        def specs(args: Any) -> list[Spec]:
            return [
                {
                    "name": a.name,
                    "datatype": _ORT_TYPES.get(a.type, a.type),
                    "shape": [d if isinstance(d, int) else -1 for d in a.shape],
                }
                for a in args
            ]

        return {
            "inputs": specs(self.session.get_inputs()),
            "outputs": specs(self.session.get_outputs()),
        }


@serve.deployment
class SyntheticTask(_Batched):
    """The shared latency model: a batch of n rows sleeps ``base_ms + per_item_ms·n``,
    then answers as ridgeline's synthetic backend does (output j is 2·input j, or 2·the
    last input, when the sizes agree; zeros otherwise)."""

    async def run(self, arrays: list[Array]) -> list[Array]:
        rows = int(arrays[0].shape[0])
        await asyncio.sleep((self.spec["base_ms"] + self.spec["per_item_ms"] * rows) / 1000.0)
        out = []
        for j, spec in enumerate(self.spec["outputs"]):
            src = arrays[min(j, len(arrays) - 1)]
            dims = [
                src.shape[k] if d == -1 and k < src.ndim else max(d, 1)
                for k, d in enumerate(spec["shape"][1:], start=1)
            ]
            shape = (rows, *dims)
            dtype = np.dtype(DTYPES[spec["datatype"]])
            if src.size == math.prod(shape):
                doubled = src if src.dtype == np.bool_ else src * 2
                out.append(doubled.astype(dtype).reshape(shape))
            else:
                out.append(np.zeros(shape, dtype=dtype))
        return out

    def signature(self) -> dict[str, list[Spec]]:
        return {"inputs": self.spec["inputs"], "outputs": self.spec["outputs"]}


# --- the graph -----------------------------------------------------------------------


def _decode(doc: Any, specs: Sequence[Spec]) -> tuple[int, list[Array]]:
    """The rows and arrays of a v2 JSON infer body, in the order of ``specs``."""
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise BadRequest("the body must be a JSON object with an 'inputs' list (v2 infer)")
    given = {t.get("name"): t for t in doc["inputs"] if isinstance(t, dict)}
    arrays: list[Array] = []
    for spec in specs:
        tensor = given.get(spec["name"])
        if tensor is None:
            raise BadRequest(f"missing input {spec['name']!r}; the model takes {_names(specs)}")
        shape = tensor.get("shape")
        if not isinstance(shape, list) or not shape or not all(isinstance(d, int) for d in shape):
            raise BadRequest(f"input {spec['name']!r}: 'shape' must be a list of integers")
        try:
            data = np.asarray(tensor.get("data"), dtype=DTYPES[spec["datatype"]])
            arrays.append(data.reshape(shape))
        except (TypeError, ValueError) as e:
            raise BadRequest(f"input {spec['name']!r}: {e}") from None
    rows = {int(a.shape[0]) for a in arrays}
    if len(rows) != 1 or 0 in rows:
        raise BadRequest(f"inputs must agree on a batch dim of at least 1 row, got {rows}")
    return rows.pop(), arrays


def _names(specs: Sequence[Spec]) -> list[str]:
    return [s["name"] for s in specs]


def _json(doc: object, status: int = 200) -> Response:
    return Response(_dumps(doc), status_code=status, media_type="application/json")


@serve.deployment
class Pipeline:
    """The ingress: v2 over HTTP, the plan's graph composed by deployment handles."""

    def __init__(self, args: dict[str, Any], handles: dict[str, Any]) -> None:
        self.name: str = args["name"]
        self.tasks: dict[str, dict[str, Any]] = args["tasks"]
        self.edges: list[dict[str, Any]] = list(args.get("edges", []))
        self.handles = handles
        targets = {e["target"] for e in self.edges}
        self.sources = [t for t in self.tasks if t not in targets]
        self.sinks = [t for t in self.tasks if not any(e["source"] == t for e in self.edges)]
        self._carry = [0.0] * len(self.edges)
        self._signatures: dict[str, dict[str, list[Spec]]] = {}

    async def signatures(self) -> dict[str, dict[str, list[Spec]]]:
        """Every task's inputs and outputs, asked of its deployment once."""
        if not self._signatures:
            found = await asyncio.gather(*(self.handles[t].signature.remote() for t in self.tasks))
            self._signatures = dict(zip(self.tasks, found, strict=True))
        return self._signatures

    async def metadata(self, model: str) -> dict[str, Any]:
        sigs = await self.signatures()
        if model in self.tasks:
            return {"name": model, "versions": ["1"], "platform": "ray_serve", **sigs[model]}
        outputs = [
            {**o, "name": f"{sink}.{o['name']}", "shape": [-1, *o["shape"][1:]]}
            for sink in self.sinks
            for o in sigs[sink]["outputs"]
        ]
        inputs = sigs[self.sources[0]]["inputs"]
        return {
            "name": self.name,
            "versions": ["1"],
            "platform": "ray_serve_pipeline",
            "inputs": inputs,
            "outputs": outputs,
        }

    async def __call__(self, request: Request) -> Response:
        path = request.url.path.rstrip("/")
        parts = path.split("/")
        if path in ("/v2/health/live", "/v2/health/ready"):
            return Response(status_code=200)
        if path == "/v2":
            return _json({"name": "ridgeline-ray-serve", "version": "1", "extensions": []})
        if len(parts) < 4 or parts[:3] != ["", "v2", "models"]:
            return _json({"error": f"no route {path}"}, 404)
        model, rest = parts[3], parts[4:]
        if len(rest) >= 2 and rest[0] == "versions":
            rest = rest[2:]
        if model != self.name and model not in self.tasks:
            known = [self.name, *self.tasks]
            return _json({"error": f"unknown model {model!r}; this server has {known}"}, 404)
        if request.method == "GET" and not rest:
            return _json(await self.metadata(model))
        if request.method == "GET" and rest == ["ready"]:
            return Response(status_code=200)
        if request.method != "POST" or rest != ["infer"]:
            return _json({"error": f"no route {request.method} {path}"}, 404)
        try:
            doc = _loads(await request.body())
        except ValueError as e:
            return _json({"error": f"the body is not JSON: {e}"}, 400)
        try:
            names, arrays = await self._infer(model, doc)
        except BadRequest as e:
            return _json({"error": str(e)}, 400)
        except Exception as e:  # a task failed, or its queue was full
            status = 503 if type(e).__name__ == "BackPressureError" else 500
            return _json({"error": f"{type(e).__name__}: {e}"}, status)
        meta = await self.metadata(model)
        outputs = [
            {
                "name": n,
                "datatype": o["datatype"],
                "shape": list(a.shape),
                "data": a.ravel().tolist(),
            }
            for n, o, a in zip(names, meta["outputs"], arrays, strict=True)
        ]
        answer: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": outputs}
        if isinstance(doc, dict) and "id" in doc:
            answer["id"] = doc["id"]
        return _json(answer)

    async def _infer(self, model: str, doc: Any) -> tuple[list[str], list[Array]]:
        sigs = await self.signatures()
        if model in self.tasks:
            rows, arrays = _decode(doc, sigs[model]["inputs"])
            outputs = await self._task(model, rows, arrays)
            return _names(sigs[model]["outputs"]), outputs
        rows, arrays = _decode(doc, sigs[self.sources[0]]["inputs"])
        results: dict[str, list[list[Array]]] = {s: [] for s in self.sinks}
        await asyncio.gather(*(self._run(s, rows, arrays, results) for s in self.sources))
        names, out = [], []
        for sink in self.sinks:
            for k, spec in enumerate(sigs[sink]["outputs"]):
                names.append(f"{sink}.{spec['name']}")
                parts = [r[k] for r in results[sink]]
                if parts:
                    out.append(np.concatenate(parts, axis=0))
                else:
                    dims = tuple(max(d, 1) for d in spec["shape"][1:])
                    out.append(np.zeros((0, *dims), dtype=DTYPES[spec["datatype"]]))
        return names, out

    async def _task(self, task: str, rows: int, arrays: list[Array]) -> list[Array]:
        """``rows`` rows through ``task``, in requests of at most its batch size."""
        size = int(self.tasks[task]["batch_size"])
        handle = self.handles[task]
        answers = await asyncio.gather(
            *(handle.infer.remote([a[i : i + size] for a in arrays]) for i in range(0, rows, size))
        )
        return [np.concatenate([a[k] for a in answers]) for k in range(len(answers[0]))]

    async def _run(
        self, task: str, rows: int, arrays: list[Array], results: dict[str, list[list[Array]]]
    ) -> None:
        outputs = await self._task(task, rows, arrays)
        if task in results:
            results[task].append(outputs)
        sigs = await self.signatures()
        children = []
        for i, edge in enumerate(self.edges):
            if edge["source"] != task:
                continue
            n, self._carry[i] = fan_out(self._carry[i], rows, float(edge["factor"]))
            if n:
                child = edge["target"]
                wanted = [(DTYPES[t["datatype"]], t["shape"][1:]) for t in sigs[child]["inputs"]]
                adapted = adapt(outputs, n, wanted)
                children.append(self._run(child, n, adapted, results))
        await asyncio.gather(*children)


# --- the application -----------------------------------------------------------------

KINDS: dict[str, Any] = {"onnx": OnnxTask, "synthetic": SyntheticTask}
"""The deployment of each task kind (``@serve.deployment`` classes)."""


def build(args: dict[str, Any]) -> Any:
    """Serve's application builder: the ingress over one deployment per task.
    ``args["deployments"]``, when given, holds each deployment's options by name (what a
    config's ``deployments[]`` sets; ``ridgeline serve --engine ray`` passes them)."""
    options = args.get("deployments", {})
    handles = {
        name: KINDS[task["kind"]].options(name=name, **options.get(name, {})).bind(task)
        for name, task in args["tasks"].items()
    }
    pipeline: Any = Pipeline
    ingress = pipeline.options(name=args["name"], **options.get(args["name"], {}))
    return ingress.bind({k: v for k, v in args.items() if k != "deployments"}, handles)
