"""Open Inference Protocol v2 over HTTP/JSON (KServe, Triton, MLServer), with aiohttp.

``connect`` opens one keep-alive pool, checks ``/v2/health/ready`` and reads the
model's metadata (learning its inputs when none were given). ``send`` posts the JSON
body encoded once per distinct ``items`` and cached.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import yarl

from ridgeline.errors import TargetUnreachableError
from ridgeline.targets._http import failed_reply, fetch, new_session, not_connected, parse_json
from ridgeline.targets.base import OK, Reply
from ridgeline.targets.tensors import TensorSpec, json_inputs
from ridgeline.workload.payloads import RequestShape


class V2HttpTarget:
    """``V2HttpTarget("http://127.0.0.1:8000", "resnet")`` posts to ``/v2/models/resnet/infer``."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        version: str | None = None,
        inputs: Sequence[TensorSpec] | None = None,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        base = base_url.rstrip("/")
        self._model_url = f"{base}/v2/models/{model}" + (f"/versions/{version}" if version else "")
        self._health_url = f"{base}/v2/health/ready"
        self._infer_url = yarl.URL(f"{self._model_url}/infer")
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        self._connect_timeout = connect_timeout
        self.inputs: tuple[TensorSpec, ...] | None = tuple(inputs) if inputs else None
        """The model's inputs: given, or learnt from its metadata at connect."""
        self._bodies: dict[int, bytes] = {}
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return self._model_url

    async def connect(self, max_outstanding: int) -> None:
        await self.close()
        session = new_session(max_outstanding, self._headers)
        try:
            await fetch(
                session,
                self._health_url,
                purpose=f"v2 server at {self._health_url} is not ready",
                hint="check that the server is running and that host and port are right",
                timeout=self._connect_timeout,
            )
            body = await fetch(
                session,
                self._model_url,
                purpose=f"model metadata at {self._model_url} is unavailable",
                hint="check the model name and version (the server logs list the loaded models)",
                timeout=self._connect_timeout,
            )
            if self.inputs is None:
                self.inputs = _inputs_of(parse_json(body, self._model_url), self._model_url)
        except BaseException:
            await session.close()
            raise
        self._session = session

    async def send(self, shape: RequestShape) -> Reply:
        body = self._bodies.get(shape.items)
        if body is None:
            body = self._encode(shape.items)
        session = self._session
        if session is None:
            raise not_connected(self)
        async with session.post(self._infer_url, data=body) as resp:
            answer = await resp.read()
            if resp.status == 200:
                return OK
        return failed_reply(resp.status, answer)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _encode(self, items: int) -> bytes:
        if self.inputs is None:
            raise not_connected(self)
        doc = {"inputs": json_inputs(self.inputs, items)}
        body = json.dumps(doc, separators=(",", ":")).encode()
        self._bodies[items] = body
        return body


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
