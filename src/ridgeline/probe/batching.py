"""Batching awareness: read the server's dynamic-batching delay and size windows to it.

A Triton / KServe model config (``GET /v2/models/NAME/config``) carries
``dynamic_batching.max_queue_delay_microseconds``. A window must hold many batching
cycles, or its latency percentiles measure where in the cycle it was cut: windows are
made at least ``CYCLES`` × the delay long.
"""

from __future__ import annotations

from typing import Any

import aiohttp

CYCLES = 50


async def batching_delay_s(model_url: str, timeout_s: float = 5.0) -> float | None:
    """The model's max queue delay in seconds, or None when the endpoint has no v2
    model config (not an http(s) v2 URL, no dynamic batching, or no answer)."""
    if not model_url.startswith(("http://", "https://")) or "/v2/models/" not in model_url:
        return None
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(model_url.rstrip("/") + "/config") as resp,
        ):
            if resp.status != 200:
                return None
            doc: Any = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    dynamic = doc.get("dynamic_batching") if isinstance(doc, dict) else None
    if not isinstance(dynamic, dict):
        return None
    us = dynamic.get("max_queue_delay_microseconds", 0)
    try:
        return float(us) / 1e6
    except (TypeError, ValueError):
        return None


def window_for(delay_s: float | None, window_s: float) -> float:
    """``window_s``, widened to CYCLES batching delays when the delay is known."""
    if delay_s is None or delay_s <= 0:
        return window_s
    return max(window_s, CYCLES * delay_s)
