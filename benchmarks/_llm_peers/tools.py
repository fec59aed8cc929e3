"""The three load generators as commands: the same load, each in its own words.

Each ``*_command`` returns the argv and environment that run one constant-rate step
against ``load.url`` and leave the tool's result where its parser (``parsers.py``) reads
it. Nothing here talks to anything but the URL given (127.0.0.1); the tokenizer is the
local GPT-2 directory (``tokenizer_dir.py``), so no tool reaches a hub.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from _llm_peers import parsers
from _llm_peers.parsers import Figures


@dataclass(frozen=True)
class Load:
    """One constant-rate step, the same for every tool."""

    url: str
    """The server's root, ``http://127.0.0.1:PORT`` (each tool adds its own path)."""
    model: str
    rate: float
    duration_s: float
    prompt_tokens: int
    output_tokens: int
    tokenizer: Path
    workdir: Path
    """An empty directory for this step's files."""


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str | None]
    """Laid over this process's environment; None removes a variable."""
    read: Callable[[str], Figures]
    """The step's figures, from the tool's stdout and the files it left."""


def _ridgeline_has(option: str) -> bool:
    done = subprocess.run(
        [sys.executable, "-m", "ridgeline", "run", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    return option in done.stdout


def ridgeline_command(load: Load) -> Command:
    """``ridgeline run``. With ``--prompt-tokens``/``--output-tokens`` (issue 15's workload
    options) it is given the lengths and the tokenizer directly; before those, the same
    lengths ride on a constant-rate trace (its ``prompt_tokens``/``output_tokens`` columns)."""
    base = f"openai+{load.url}/v1"
    common = ["--model", load.model, "--duration", f"{load.duration_s:g}", "--json"]
    common += ["--db", str(load.workdir / "runs.sqlite")]
    if _ridgeline_has("--prompt-tokens"):
        shape = ["--rate", f"{load.rate:g}", "--arrival", "constant"]
        shape += ["--prompt-tokens", str(load.prompt_tokens)]
        shape += ["--output-tokens", str(load.output_tokens)]
        if _ridgeline_has("--tokenizer"):
            shape += ["--tokenizer", str(load.tokenizer)]
    else:
        trace = load.workdir / "constant.jsonl"
        n = round(load.rate * load.duration_s)
        row = {"prompt_tokens": load.prompt_tokens, "output_tokens": load.output_tokens}
        trace.write_text(
            "".join(json.dumps({"timestamp": i / load.rate, **row}) + "\n" for i in range(n))
        )
        shape = ["--trace", str(trace)]
    argv = [sys.executable, "-m", "ridgeline", "run", base, *shape, *common]
    return Command(argv, {}, lambda out: parsers.ridgeline(json.loads(out)))


def guidellm_command(load: Load, venv: Path) -> Command:
    """``guidellm run``: the constant profile, a duration constraint, synthetic text of the
    asked lengths, the local tokenizer (``HF_HUB_OFFLINE=1``: no hub)."""
    report = load.workdir / "guidellm.json"
    argv = [
        str(venv / "bin" / "guidellm"),
        "run",
        "--backend",
        f"kind=openai_http,target={load.url},request_format=/v1/completions",
        "--tokenizer",
        f"kind=huggingface_auto,model={load.tokenizer}",
        "--profile",
        f"kind=constant,rate={load.rate:g}",
        "--constraint",
        f"kind=max_duration,seconds={load.duration_s:g}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={load.prompt_tokens},"
        f"output_tokens={load.output_tokens}",
        "--output",
        f"kind=json,path={report}",
        "--disable-console-interactive",
    ]
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return Command(argv, env, lambda _: parsers.guidellm(report, load.rate))


def aiperf_command(load: Load, venv: Path) -> Command:
    """``aiperf profile``: constant arrivals at the rate, the duration, ISL/OSL, server
    token counts. ``HF_HUB_OFFLINE`` must be unset: with it set, AIPerf 0.13 treats the
    local directory as a hub id and stops ("Failed to load tokenizer '/work/peers/...':
    HFValidationError: Repo id must be in the form 'repo_name' or
    'namespace/repo_name'"); unset, it loads the directory and reaches no hub."""
    artifacts = load.workdir / "aiperf"
    argv = [
        str(venv / "bin" / "aiperf"),
        "profile",
        "-m",
        load.model,
        "-u",
        load.url,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--request-rate",
        f"{load.rate:g}",
        "--arrival-pattern",
        "constant",
        "--benchmark-duration",
        f"{load.duration_s:g}",
        "--isl",
        str(load.prompt_tokens),
        "--osl",
        str(load.output_tokens),
        "--tokenizer",
        str(load.tokenizer),
        "--use-server-token-count",
        "--artifact-dir",
        str(artifacts),
        "--ui",
        "none",
        "--no-gpu-telemetry",  # else it polls DCGM on localhost:9400 and :9401
    ]
    return Command(argv, {"HF_HUB_OFFLINE": None}, lambda _: parsers.aiperf(artifacts, load.rate))
