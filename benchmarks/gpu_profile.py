"""Measure profile rows on the GPUs this host has, for when one is at hand. Not a test.

For each zoo model (`ridgeline.zoo`; built here at native input size if the zoo directory
has none: `--input-scale 1.0`), each batch size, and each device this host already
offers, it times batches through onnxruntime's CUDA execution provider and writes a
profile table (`pipeline/profiles.py`) whose rows are `measured`, the table `ridgeline
plan --profiles` reads:

    python benchmarks/gpu_profile.py --out gpu-profiles.csv
    python benchmarks/gpu_profile.py --families classifier --batches 1,8,32 --seconds 2

Devices, as `nvidia-smi -L` lists them; nothing is created or reconfigured:
- a GPU without MIG: its rows are the pool's whole-GPU profile (`7g.80gb` on an
  A100-80GB). Such a GPU has all its SMs (108 on an A100, 98 in a 7g instance), so its
  rows are a little faster than a 7g slice's;
- each MIG instance already there (MIG on): rows for its profile (`1g.10gb`, ...), in a
  process of its own that sees only that instance (`CUDA_VISIBLE_DEVICES=MIG-...`);
- MPS shares (`1g.10gb@1/2`, `@1/3`) of the smallest MIG profile, only when an MPS
  control daemon is already running (its pipe directory exists): the client sets
  `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`. No daemon, no MPS rows.
This script never runs `nvidia-smi mig`, `-mig`, `-cgi` or anything else that changes a
GPU's settings; it only lists (`nvidia-smi -L`, `--query-gpu`).

A point: the session is made and warmed (`--warmup` batches), then batches of the same
input run back to back for `--seconds`; the latency is the mean of
`InferenceSession.run` (host-to-device copies of the inputs and back included, as a
serving worker pays them), the throughput `batch × 1000 / latency`. Inputs are the
project's deterministic pattern (`targets.tensors`). Each row's progress line shows the
calibrated roofline's latency beside it (`pipeline.roofline`, on the zoo model's own
FLOPs), a check of the fit on real hardware.

The rows are of the zoo's models as built (their FLOPs in the manifest: reduced channel
widths), as `ridgeline profile`'s CPU rows are. Without an NVIDIA GPU, `nvidia-smi` or
onnxruntime's CUDA execution provider it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

MPS_SHARES = (Fraction(1, 2), Fraction(1, 3))


@dataclass(frozen=True)
class Device:
    """Something one process can run on: a whole GPU or a MIG instance."""

    visible: str
    """What ``CUDA_VISIBLE_DEVICES`` names it by (a GPU's index or a MIG UUID)."""
    gpu_name: str
    memory_mib: int
    profile: str | None
    """The MIG profile (``1g.10gb``), None for a whole GPU."""


def list_devices() -> tuple[list[Device], str]:
    """The devices ``nvidia-smi -L`` lists (read only), or none and why."""
    if shutil.which("nvidia-smi") is None:
        return [], "no nvidia-smi on PATH: this host has no NVIDIA driver"
    query = [
        "nvidia-smi",
        "--query-gpu=index,name,memory.total,mig.mode.current",
        "--format=csv,noheader,nounits",
    ]
    try:
        gpus = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
        listing = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return [], f"nvidia-smi could not list the GPUs: {e}"
    info: dict[str, tuple[str, int, bool]] = {}  # index: name, MiB, MIG on
    for line in gpus.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            info[parts[0]] = (parts[1], int(float(parts[2])), parts[3] == "Enabled")
    devices: list[Device] = []
    index = None
    migs: dict[str, list[Device]] = {}
    for line in listing.splitlines():
        gpu = re.match(r"GPU (\d+): (.+?) \(UUID", line)
        mig = re.match(r"\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)]+)\)", line)
        if gpu:
            index = gpu.group(1)
        elif mig and index is not None and index in info:
            name, mem, _ = info[index]
            migs.setdefault(index, []).append(Device(mig.group(2), name, mem, mig.group(1)))
    for i, (name, mem, mig_on) in info.items():
        if mig_on and not migs.get(i):
            print(f"GPU {i} has MIG on and no instances: nothing of it to use", file=sys.stderr)
        devices += migs.get(i, []) if mig_on else [Device(i, name, mem, None)]
    if not devices:
        return [], "nvidia-smi lists no GPU this script can use as it is set up"
    return devices, ""


def pool_of(device: Device) -> str | None:
    """The ridgeline GPU type of a device (``NVIDIA A100-SXM4-80GB`` → ``A100-80GB``), or
    None when ``pipeline.gpu`` has no such type."""
    from ridgeline.pipeline.gpu import GPU_TYPES

    family = re.search(r"\b([AHBL]\d{2,3})\b", device.gpu_name.replace("-", " "))
    if family is None:
        return None
    gb = device.memory_mib / 1024
    # the type of that family whose memory is nearest (80 GB cards report ~79.6 GiB)
    known = [g for g in GPU_TYPES.values() if g.name.startswith(family.group(1) + "-")]
    if not known:
        return None
    best = min(known, key=lambda g: abs(g.memory_gb - gb))
    return best.name if abs(best.memory_gb - gb) < 0.2 * best.memory_gb else None


def mps_running() -> bool:
    """Whether an MPS control daemon is already serving (its pipe directory exists)."""
    pipes = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    return (pipes / "control").exists()


def cuda_provider() -> str:
    """Why onnxruntime cannot run on CUDA here, or '' when it can."""
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed (pip install onnxruntime-gpu)"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return (
            "onnxruntime has no CUDA execution provider (providers: "
            f"{', '.join(ort.get_available_providers())}); install onnxruntime-gpu"
        )
    return ""


# --- one device, in a process of its own -------------------------------------------------


def measure_here(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Time every (model, batch) of ``job`` on the one device this process sees."""
    import numpy as np
    import onnxruntime as ort

    from ridgeline.targets.tensors import raw_bytes
    from ridgeline.v2.spec import TensorSpec
    from ridgeline.v2.tensors import LITTLE_ENDIAN

    out = []
    for model in job["models"]:
        session = ort.InferenceSession(
            model["path"], providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
        )
        if session.get_providers()[0] != "CUDAExecutionProvider":
            raise SystemExit(f"onnxruntime fell back to the CPU for {model['path']}")
        specs = [TensorSpec(i["name"], i["datatype"], tuple(i["shape"])) for i in model["inputs"]]
        for b in job["batches"]:
            if b > model["max_batch_size"]:
                continue
            feed = {
                s.name: np.frombuffer(raw_bytes(s, b), LITTLE_ENDIAN[s.datatype]).reshape(
                    s.concrete_shape(b)
                )
                for s in specs
            }
            for _ in range(job["warmup"]):
                session.run(None, feed)
            runs, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < job["seconds"] or runs < 3:
                session.run(None, feed)
                runs += 1
            ms = 1000 * elapsed / runs
            out.append({"variant": model["name"], "batch": b, "latency_ms": ms, "runs": runs})
    return out


def run_on(device: Device, job: dict[str, Any], share: Fraction | None) -> list[dict[str, Any]]:
    """``measure_here`` in a child process that sees only ``device`` (and, for an MPS
    share, is limited to that share of its threads)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=device.visible)
    if share is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(int(share * 100))
    done = subprocess.run(
        [sys.executable, __file__, "--child"],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"measuring on {device.visible} failed:\n{done.stderr[-4000:]}")
    rows: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return rows


# --- the whole run -----------------------------------------------------------------------


def segments(devices: Sequence[Device], pool: str) -> list[tuple[Device, str, Fraction | None]]:
    """(device, segment label, MPS share) for every device of ``pool``: each whole GPU or
    MIG instance once, and MPS shares of the smallest profile when a daemon runs."""
    from ridgeline.pipeline.gpu import gpu_type

    g = gpu_type(pool)
    known = {p.name for p in g.profiles}
    smallest = min(g.profiles, key=lambda p: (p.compute, p.memory_slices)).name
    out: list[tuple[Device, str, Fraction | None]] = []
    seen: set[str] = set()
    for d in devices:
        label = g.whole.name if d.profile is None else d.profile
        if label not in known:
            print(f"skipped {d.visible}: {pool} has no profile {label}", file=sys.stderr)
            continue
        if label in seen:  # one instance of a profile is enough
            continue
        seen.add(label)
        out.append((d, label, None))
        if label == smallest and mps_running():
            out += [(d, f"{label}@{s}", s) for s in MPS_SHARES]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", type=Path, help="zoo directory (default: $RIDGELINE_ZOO)")
    parser.add_argument("--families", default="", help="zoo families, e.g. detector,classifier")
    parser.add_argument("--batches", default="1,2,4,8,16,32")
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per point")
    parser.add_argument("--warmup", type=int, default=10, help="batches run before timing")
    parser.add_argument("--input-scale", type=float, default=1.0, help="zoo input size, if built")
    parser.add_argument("--pool", help="the GPU type to file rows under (default: detected)")
    parser.add_argument("--out", type=Path, default=Path("gpu-profiles.csv"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure_here(json.loads(sys.stdin.read()))))
        return 0

    devices, why = list_devices()
    why = why or cuda_provider()
    if why:
        print(f"no GPU to profile: {why}. Nothing measured; exiting.")
        return 0
    pool = args.pool or pool_of(devices[0])
    if pool is None:
        from ridgeline.pipeline.gpu import GPU_TYPES

        print(
            f"{devices[0].gpu_name} ({devices[0].memory_mib} MiB) is no GPU type ridgeline "
            f"knows ({', '.join(GPU_TYPES)}); give --pool",
            file=sys.stderr,
        )
        return 2
    devices = [d for d in devices if d.gpu_name == devices[0].gpu_name]

    from ridgeline.pipeline.profiles import ProfileRow, ProfileTable
    from ridgeline.pipeline.roofline import Cost, modelled_rows
    from ridgeline.zoo.build import build_zoo, default_zoo_dir
    from ridgeline.zoo.families import FAMILIES
    from ridgeline.zoo.manifest import load_manifest

    zoo = args.zoo or default_zoo_dir()
    families = [f.strip() for f in args.families.split(",") if f.strip()] or list(FAMILIES)
    if not (zoo / "manifest.json").is_file():
        print(f"building the zoo into {zoo} (input scale {args.input_scale:g})", file=sys.stderr)
        build_zoo(zoo, families, input_scale=args.input_scale)
    manifest = load_manifest(zoo)
    chosen = [v for v in manifest.variants if v.family in families]
    batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    job = {
        "batches": batches,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "models": [
            {
                "name": v.name,
                "path": str(zoo / v.path),
                "max_batch_size": v.max_batch_size,
                "inputs": [
                    {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                    for t in v.inputs
                ],
            }
            for v in chosen
        ],
    }
    costs = {v.name: Cost(v.name, v.gflops_per_item) for v in chosen}
    rows: list[ProfileRow] = []
    for device, label, share in segments(devices, pool):
        print(f"{pool} {label} on {device.visible}", file=sys.stderr)
        for m in run_on(device, job, share):
            name, b, ms = m["variant"], m["batch"], m["latency_ms"]
            rows.append(ProfileRow(name, pool, label, b, ms, b * 1000 / ms, "measured"))
            (fit,) = [r for r in modelled_rows([costs[name]], pool, [b]) if r.segment == label]
            print(
                f"  {name} batch {b}: {ms:.2f} ms ({m['runs']} runs); roofline "
                f"({fit.source}) {fit.latency_ms:.2f} ms",
                file=sys.stderr,
            )
    args.out.write_text(ProfileTable(rows).to_csv())
    print(f"{len(rows)} measured rows written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
