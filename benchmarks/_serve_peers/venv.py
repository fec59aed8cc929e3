"""The peers' own virtual environment, ``.bench-venv/`` (build output: it holds a
``.gitignore`` of ``*``), so that the project's ``.venv`` stays clean.

What goes in, and why each pin:

- ``mlserver`` with ``uvloop<0.22``: uvloop 0.22 (October 2025) makes
  ``asyncio.get_event_loop()`` raise in MLServer 1.7.1's parallel workers, which then
  die at start ("There is no current event loop", SeldonIO/MLServer#2286).
- ``ray[serve]``.
- ``tritonclient[http]==2.48.0`` for its ``perf_analyzer`` executable (the issue names
  2.48 as the last wheel whose perf_analyzer runs on this machine's glibc, 2.36; its
  binary asks for GLIBC_2.34 at most). Not ``[all]``: its gRPC extra pins
  ``protobuf<5``, and MLServer 1.7's generated gRPC code needs protobuf ≥ 5.26
  (``google.protobuf.runtime_version``), so with ``[all]`` MLServer fails to import.
  The executable is the same; the extras are Python clients, which nothing here uses.
- ``nvidia-cuda-runtime-cu12``: perf_analyzer links ``libcudart.so.12`` even on a CPU-only
  machine; this wheel carries it (found through LD_LIBRARY_PATH).
- ``onnxruntime``, ``numpy``, ``orjson``: the shared session and the Ray adapter.

When the whole set cannot be installed, each group is tried alone, and what fails is
reported as not installable, with pip's reason; the others are still measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

GROUPS: dict[str, list[str]] = {
    "onnxruntime": ["onnxruntime", "numpy", "orjson"],
    "MLServer": ["mlserver", "uvloop<0.22"],
    "Ray Serve": ["ray[serve]"],
    "perf_analyzer": ["tritonclient[http]==2.48.0", "nvidia-cuda-runtime-cu12"],
}
CHECKS: dict[str, str] = {
    "onnxruntime": "import onnxruntime, numpy, orjson",
    "MLServer": "import mlserver, mlserver.codecs",
    "Ray Serve": "from ray import serve",
    "perf_analyzer": "import tritonclient",
}
DISTRIBUTIONS = ("mlserver", "ray", "onnxruntime", "numpy", "tritonclient", "uvloop")


@dataclass
class BenchEnv:
    root: Path
    versions: dict[str, str] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    """Group → why it cannot be used here."""

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def bin(self, name: str) -> Path:
        return self.root / "bin" / name


def ensure_bench_venv(root: Path) -> BenchEnv:
    """Create ``root`` if missing, install what is missing, and say what is unusable."""
    return ensure_venv(BenchEnv(root), GROUPS, CHECKS, DISTRIBUTIONS, Path(sys.executable))


def ensure_venv(
    env: BenchEnv,
    groups: dict[str, list[str]],
    checks: dict[str, str],
    distributions: tuple[str, ...],
    python: Path,
) -> BenchEnv:
    """Make ``env.root`` a venv of ``python`` if missing, install ``groups`` (each group's
    packages) when they changed, record the ``distributions``' versions and, in
    ``env.problems``, every group that cannot be installed or whose check does not run."""
    root = env.root
    if not env.python.exists():
        print(f"creating {root} (a virtual environment for the peers, from {python})", flush=True)
        subprocess.run([str(python), "-m", "venv", str(root)], check=True)
        (root / ".gitignore").write_text("# build output of benchmarks/serve.py\n*\n")
    stamp = root / ".installed"
    wanted = json.dumps(groups, sort_keys=True)
    if not stamp.exists() or stamp.read_text() != wanted:
        failed = _install(env, groups)
        env.problems.update(failed)
        if not failed:
            stamp.write_text(wanted)
    for group, code in checks.items():
        if group in env.problems:
            continue
        check = subprocess.run([str(env.python), "-c", code], capture_output=True, text=True)
        if check.returncode != 0:
            why = (check.stderr.strip().splitlines() or ["(no message)"])[-1]
            env.problems[group] = f"installed but does not import: {why}"
    env.versions = _versions(env, distributions)
    return env


def _pip(env: BenchEnv, packages: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = [str(env.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    return subprocess.run([*cmd, *packages], capture_output=True, text=True, timeout=1800)


def _install(env: BenchEnv, groups: dict[str, list[str]]) -> dict[str, str]:
    everything = [p for group in groups.values() for p in group]
    print(f"installing into {env.root}: {' '.join(everything)}", flush=True)
    if _pip(env, everything).returncode == 0:
        return {}
    failed = {}
    for group, packages in groups.items():
        done = _pip(env, packages)
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
            failed[group] = "not installable here: " + (
                errors[0] if errors else done.stderr.strip()[-300:]
            )
            print(f"  {group}: {failed[group]}", flush=True)
    return failed


def _versions(env: BenchEnv, distributions: tuple[str, ...]) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json\n"
        "out = {}\n"
        f"for d in {distributions!r}:\n"
        "    try: out[d] = m.version(d)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    done = subprocess.run([str(env.python), "-c", code], capture_output=True, text=True)
    versions: dict[str, str] = json.loads(done.stdout) if done.returncode == 0 else {}
    return versions
