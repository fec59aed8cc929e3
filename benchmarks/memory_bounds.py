"""Memory under hostile bodies (issue 33, faults 2 and 5; `docs/reliability.md`).

Starts a server as its own process on 127.0.0.1 and reads its resident memory from
``/proc`` (VmRSS now, VmHWM the peak) before, during and after:

- ``prompt``: the fake LLM server (``--preset llm``) sent one completion whose prompt is
  10 MB of text, and beside it, once that is sent, a 1-token request: how long the small
  one waited, what the large one was answered, the RSS;
- ``bodies``: the fake v2 server sent four JSON bodies of ~63 MiB at once (a float
  tensor near the default 64 MiB body bound; more rows than the model batches, so each
  decoded one is answered 400): what each was answered, the RSS.

    python benchmarks/memory_bounds.py [prompt|bodies ...]   # one JSON object
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

CLI = [sys.executable, "-c", "from ridgeline._entry import main; main()"]
MB = 1 << 20


def rss_mb(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    got = {k: float(v) / 1024 for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M)}
    return {"rss_mb": round(got["VmRSS"], 1), "peak_mb": round(got["VmHWM"], 1)}


def start(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [*CLI, "fake-server", "--port", "0", "--grpc-port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if m := re.search(r"v2 HTTP\s+(http://127\.0\.0\.1:\d+)", line):
            return proc, m.group(1)
    raise RuntimeError("the fake server printed no URL")


async def prompt_case() -> dict[str, Any]:
    proc, base = start("--preset", "llm")
    try:
        before = rss_mb(proc.pid)
        big = {"model": "fake-llm", "prompt": "hello world " * (10 * MB // 12), "max_tokens": 1}
        small = {"model": "fake-llm", "prompt": "hi", "max_tokens": 1}
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            url = f"{base}/v1/completions"

            async def post(body: dict[str, Any]) -> tuple[int, float]:
                t = time.perf_counter()
                async with s.post(url, json=body) as r:
                    await r.read()
                    return r.status, time.perf_counter() - t

            await post(small)  # the tokenizer loaded, the server warm
            warm = rss_mb(proc.pid)
            large = asyncio.create_task(post(big))
            await asyncio.sleep(0.2)  # the large body on its way (a benchmark, not a test)
            small_status, small_s = await post(small)
            large_status, large_s = await large
            during = rss_mb(proc.pid)
            await asyncio.sleep(2.0)
            after = rss_mb(proc.pid)
        return {
            "before_mb": before["rss_mb"],
            "warm_mb": warm["rss_mb"],
            "peak_mb": during["peak_mb"],
            "after_mb": after["rss_mb"],
            "large": {"status": large_status, "seconds": round(large_s, 2)},
            "small_beside_it": {"status": small_status, "seconds": round(small_s, 3)},
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def bodies_case() -> dict[str, Any]:
    proc, base = start()
    try:
        before = rss_mb(proc.pid)
        n = (63 * MB) // len("0.123456789,") // 16 * 16
        data = ",".join(["0.123456789"] * n)
        tensor = f'{{"name":"INPUT0","shape":[{n // 16},16],"datatype":"FP32","data":[{data}]}}'
        body = f'{{"inputs":[{tensor}]}}'.encode()
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as s:

            async def post() -> int:
                async with s.post(
                    f"{base}/v2/models/fake/infer",
                    data=body,
                    headers={"Content-Type": "application/json"},
                ) as r:
                    await r.read()
                    return r.status

            statuses = await asyncio.gather(*(post() for _ in range(4)))
            during = rss_mb(proc.pid)
            await asyncio.sleep(2.0)
            after = rss_mb(proc.pid)
        return {
            "body_mb": round(len(body) / MB, 1),
            "statuses": sorted(statuses),
            "before_mb": before["rss_mb"],
            "peak_mb": during["peak_mb"],
            "after_mb": after["rss_mb"],
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


CASES = {"prompt": prompt_case, "bodies": bodies_case}


def main() -> None:
    names = sys.argv[1:] or list(CASES)
    out = {name: asyncio.run(CASES[name]()) for name in names}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
