"""Open Inference Protocol v2 over HTTP/JSON (KServe, Triton, MLServer), with aiohttp.

``connect`` checks ``/v2/health/ready`` and reads the model's metadata (learning its
inputs when none were given) with aiohttp; ``send`` writes the whole infer request,
prepared once per distinct ``items``, on a lean keep-alive pool (``_fastpool``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ridgeline.errors import TargetUnreachableError
from ridgeline.targets._fastpool import Http1Pool
from ridgeline.targets._http import Get, JsonHttpTarget, failed_reply, not_connected, parse_json
from ridgeline.targets.base import OK, Reply
from ridgeline.targets.tensors import json_inputs
from ridgeline.v2.security import client_context
from ridgeline.v2.spec import TensorSpec
from ridgeline.workload.payloads import RequestShape


class V2HttpTarget(JsonHttpTarget):
    """``V2HttpTarget("http://127.0.0.1:8000", "resnet")`` posts to ``/v2/models/resnet/infer``."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        version: str | None = None,
        inputs: Sequence[TensorSpec] | None = None,
        headers: Mapping[str, str] | None = None,
        ca_file: Path | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        base = base_url.rstrip("/")
        self._model_url = f"{base}/v2/models/{model}" + (f"/versions/{version}" if version else "")
        infer_url = f"{self._model_url}/infer"
        super().__init__(self._model_url, infer_url, headers, ca_file, connect_timeout)
        self._health_url = f"{base}/v2/health/ready"
        self.inputs: tuple[TensorSpec, ...] | None = tuple(inputs) if inputs else None
        """The model's inputs: given, or learnt from its metadata at connect."""
        self._requests: dict[int, bytes] = {}
        self._pool: Http1Pool | None = None

    async def connect(self, max_outstanding: int) -> None:
        checked = await self._checked_session(max_outstanding)
        await checked.close()  # it served the checks; requests go through the pool
        tls = None if self._ca_file is None else client_context(self._ca_file)
        self._pool = Http1Pool(str(self._post_url.origin()), max_outstanding, tls)

    async def send(self, shape: RequestShape) -> Reply:
        pool = self._pool
        if pool is None:
            raise not_connected(self)
        raw = self._requests.get(shape.items)
        if raw is None:
            raw = self._prepare(shape.items)
        status, answer = await pool.request(raw)
        if status == 200:
            return OK
        return failed_reply(status, answer)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def _check(self, get: Get) -> None:
        """The server is ready and serves the model; with no inputs given, learn them."""
        await get(
            self._health_url,
            purpose=f"v2 server at {self._health_url} is not ready",
            hint="check that the server is running and that host and port are right",
        )
        body = await get(
            self._model_url,
            purpose=f"model metadata at {self._model_url} is unavailable",
            hint="check the model name and version (the server logs list the loaded models)",
        )
        if self.inputs is None:
            self.inputs = _inputs_of(parse_json(body, self._model_url), self._model_url)

    def _prepare(self, items: int) -> bytes:
        if self.inputs is None or self._pool is None:
            raise not_connected(self)
        doc = {"inputs": json_inputs(self.inputs, items)}
        body = json.dumps(doc, separators=(",", ":")).encode()
        raw = self._pool.prepare("POST", self._post_url.raw_path_qs, self._headers, body)
        self._requests[items] = raw
        return raw


def _inputs_of(metadata: Any, url: str) -> tuple[TensorSpec, ...]:
    try:
        return tuple(
            TensorSpec(str(i["name"]), str(i["datatype"]), tuple(int(d) for d in i["shape"]))
            for i in metadata["inputs"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise TargetUnreachableError(
            f"model metadata at {url} has no usable 'inputs' list ({exc!r}); "
            "give the inputs explicitly (NAME:DATATYPE:DIMS)"
        ) from exc
