"""TTFT on the wire, the same for every tool: per server port, from a completion POST's
first bytes (client to server) to the first SSE ``data: {`` bytes of its answer (server
to client), read from a ``tcpdump -i lo`` capture. Not a test.

    tcpdump -i lo -s 0 -w agree.pcap tcp &
    RIDGELINE_BENCH_LLM_LADDER= .venv/bin/python benchmarks/llm.py; kill %1
    python3 benchmarks/_llm_peers/wire.py agree.pcap   # one line per server, in order

``benchmarks/llm.py`` starts a fresh server per tool, so the lines are ridgeline's,
GuideLLM's and AIPerf's runs in turn: a tool's TTFT over its own run's wire TTFT is its
own overhead, free of how the server differed between runs.
"""

from __future__ import annotations

import statistics
import struct
import sys
from collections import defaultdict
from collections.abc import Iterator


def packets(path: str) -> Iterator[tuple[float, int, int, bytes]]:
    with open(path, "rb") as f:
        gh = f.read(24)
        magic = struct.unpack("<I", gh[:4])[0]
        nano = magic == 0xA1B23C4D
        link = struct.unpack("<I", gh[20:24])[0]
        while True:
            h = f.read(16)
            if len(h) < 16:
                return
            sec, frac, incl, _ = struct.unpack("<IIII", h)
            data = f.read(incl)
            ts = sec + frac / (1e9 if nano else 1e6)
            off = 14 if link == 1 else (16 if link == 113 else 4 if link == 0 else 14)
            ip = data[off:]
            if not ip or ip[0] >> 4 != 4:
                continue
            ihl = (ip[0] & 15) * 4
            if ip[9] != 6:
                continue
            tcp = ip[ihl:]
            sport, dport = struct.unpack(">HH", tcp[:4])
            doff = (tcp[12] >> 4) * 4
            payload = tcp[doff:]
            if payload:
                yield ts, sport, dport, payload


def posted_to(path: str) -> list[int]:
    """Every port a completion was POSTed to, in order of first use."""
    seen: list[int] = []
    for _, _, dport, pay in packets(path):
        if pay.startswith(b"POST /v1/completions") and dport not in seen:
            seen.append(dport)
    return seen


def main(path: str, servers: list[str]) -> None:
    ports = [int(p) for p in servers] or posted_to(path)
    start: dict[tuple[int, int], float] = {}  # (client, server port): its POST's time
    ttft: dict[int, list[float]] = defaultdict(list)
    for ts, sport, dport, pay in packets(path):
        if dport in ports and pay.startswith(b"POST "):
            start[(sport, dport)] = ts
        elif sport in ports and (dport, sport) in start and b"data: {" in pay:
            ttft[sport].append(1000 * (ts - start.pop((dport, sport))))
    for port in ports:
        v = ttft.get(port, [])
        print(port, len(v), f"p50 {statistics.median(v):.2f} ms" if v else "none")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
