"""Triton's own virtual environment, ``.triton-venv/`` (build output: it holds a
``.gitignore`` of ``*``), and the ``tritonserver`` in it, made runnable here.

Its own, apart from ``.bench-venv``: ``nvidia-pytriton`` 0.7 (the only wheel carrying a
``tritonserver`` that runs on CPU here: 2.51, with the Python backend alone) requires
``numpy<2`` and ``tritonclient~=2.50``, which MLServer's and Ray's environment need not
accept. What goes in: ``nvidia-pytriton==0.7.0``, ``onnxruntime`` (the shared session
runs in the Python backend's stub process, under this environment's Python) and
``numpy<2``.

Three things make the bundled server run a plain model repository (PyTriton does them
itself when it starts the server; nothing here uses PyTriton's proxy):

- the environment is made from the base interpreter (``sys.base_prefix``, here pyenv's
  3.11.7), never from another venv, and that interpreter must have a shared libpython:
  the Python backend's stub links ``libpython3.X.so``, and found through
  ``LD_LIBRARY_PATH`` in that interpreter's ``LIBDIR``. Without it the loader takes the
  distribution's libpython of another patch release, and models fail to load with
  ``'_thread.RLock' object has no attribute '_recursion_count'``;
- the stub for this Python (``pytriton/tritonserver/python_backend_stubs/3.X/``) is
  copied to ``backends/python/``, where Triton looks for it;
- the server runs with ``nvidia_pytriton.libs`` (its shared libraries) on
  ``LD_LIBRARY_PATH`` and this environment's ``bin`` first on ``PATH``: the stub's
  embedded interpreter finds its ``sys.prefix`` — and so numpy and onnxruntime — through
  the ``python3`` it sees on ``PATH``.

``ensure_triton_venv(root)`` does all of it, once, and reports in ``problems`` what
keeps Triton from running here rather than raising. ``TritonEnv.command`` and
``TritonEnv.environ`` start the server on any model repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from _serve_peers.venv import BenchEnv, ensure_venv

GROUP = "Triton"
GROUPS = {GROUP: ["nvidia-pytriton==0.7.0", "onnxruntime", "numpy<2"]}
CHECKS = {GROUP: "import onnxruntime, numpy, pytriton"}
DISTRIBUTIONS = ("nvidia-pytriton", "onnxruntime", "numpy", "tritonclient")


@dataclass
class TritonEnv(BenchEnv):
    libdir: str = ""
    """The interpreter's LIBDIR, where its libpython lies (empty when unknown)."""

    @property
    def pytriton(self) -> Path:
        found = sorted(self.root.glob("lib/python*/site-packages/pytriton"))
        return found[0] if found else self.root / "lib" / "missing" / "pytriton"

    @property
    def tritonserver(self) -> Path:
        return self.pytriton / "tritonserver" / "bin" / "tritonserver"

    @property
    def backends(self) -> Path:
        return self.pytriton / "tritonserver" / "backends"

    @property
    def stub(self) -> Path:
        return self.backends / "python" / "triton_python_backend_stub"

    def environ(self) -> dict[str, str]:
        """The variables ``tritonserver`` runs with (on top of the caller's)."""
        libs = [str(self.pytriton.parent / "nvidia_pytriton.libs"), self.libdir]
        path = ":".join([*libs, os.environ.get("LD_LIBRARY_PATH", "")]).strip(":")
        return {"LD_LIBRARY_PATH": path, "PATH": f"{self.root / 'bin'}:{os.environ['PATH']}"}

    def command(
        self, repository: Path, http_port: int, grpc_port: int, metrics_port: int
    ) -> list[str]:
        """``tritonserver`` serving ``repository``, every port bound to 127.0.0.1."""
        return [
            str(self.tritonserver),
            *("--model-repository", str(repository), "--backend-directory", str(self.backends)),
            *("--http-address", "127.0.0.1", "--http-port", str(http_port)),
            *("--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port)),
            *("--metrics-address", "127.0.0.1", "--metrics-port", str(metrics_port)),
            *("--allow-gpu-metrics", "false", "--exit-timeout-secs", "5"),
        ]


def ensure_triton_venv(root: Path) -> TritonEnv:
    """Create ``root`` if missing (from the base interpreter), install what is missing,
    put the Python backend's stub in place, and say in ``problems[GROUP]`` what keeps
    ``tritonserver`` from running here."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    env = TritonEnv(root)
    ensure_venv(env, GROUPS, CHECKS, DISTRIBUTIONS, base)
    if GROUP not in env.problems:
        problem = _make_runnable(env)
        if problem is not None:
            env.problems[GROUP] = problem
    return env


def _make_runnable(env: TritonEnv) -> str | None:
    """Put the stub in place and check that the server and the stub find their libraries;
    why they cannot run, or None."""
    code = (
        "import json, sys, sysconfig; print(json.dumps([sys.version_info[:2],"
        " sysconfig.get_config_var('LIBDIR'), sysconfig.get_config_var('Py_ENABLE_SHARED')]))"
    )
    done = subprocess.run([str(env.python), "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        return f"its Python does not run: {done.stderr.strip()[-300:]}"
    (major, minor), env.libdir, shared = json.loads(done.stdout)
    if not shared:
        return (
            f"{env.python} has no shared libpython, which Triton's Python backend links:"
            f" rebuild {env.root} from an interpreter built with --enable-shared"
        )
    stub = env.pytriton / "tritonserver" / "python_backend_stubs" / f"{major}.{minor}"
    stub = stub / "triton_python_backend_stub"
    if not stub.exists():
        return f"nvidia-pytriton has no Python backend stub for Python {major}.{minor} ({stub})"
    if not env.stub.exists():
        shutil.copy2(stub, env.stub)
    lib_env = {**os.environ, **env.environ()}
    for exe in (env.tritonserver, env.stub):
        out = subprocess.run(["ldd", str(exe)], capture_output=True, text=True, env=lib_env)
        missing = [line.split()[0] for line in out.stdout.splitlines() if "not found" in line]
        if missing:
            return f"cannot run here: {exe.name} misses shared libraries {', '.join(missing)}"
        wrong = [line for line in out.stdout.splitlines() if "libpython" in line]
        if wrong and env.libdir not in wrong[0]:
            return f"{exe.name} would load another Python's library: {wrong[0].strip()}"
    return None
