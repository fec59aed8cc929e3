"""``TargetOptions``: what a target is sent besides its URL, one typed value.

The command line builds it once (``cli.measure.ClientOptions.target_options``); the step
(``loadgen.step``), its generators (in this loop, in local processes, on Ray actors) and
the probe's network driver carry it unopened to ``make_target``, which alone reads it.
It pickles: shards and Ray workers get it across processes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ridgeline.v2.spec import TensorSpec

OpenAIApi = Literal["completions", "chat"]


@dataclass(frozen=True, slots=True)
class TargetOptions:
    """Every option a target adapter may take; each adapter reads the ones it knows."""

    model: str | None = None
    """The model, when the URL names none (v2 and gRPC), or the OpenAI model asked for."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Sent with every request (and the connect check)."""
    inputs: Sequence[TensorSpec] | None = None
    """A v2 model's inputs; None: learnt from its metadata at connect."""
    openai_api: OpenAIApi = "completions"
    stream: bool = True
    """OpenAI: stream the answer (token times) or read it whole."""
    method: str = "POST"
    """The generic HTTP target's method."""
    body: str | None = None
    """The generic HTTP target's body template; given, any http(s) URL is generic."""
    token: str | None = None
    """Sent as ``Authorization: Bearer``."""
    ca_file: Path | None = None
    """A PEM bundle trusted beside the system's CAs for https and grpcs."""
    ignore_eos: bool = True
    """OpenAI: ask the server to generate the length asked, past its end-of-sequence."""
    tokenizer: str | None = None
    """OpenAI: what counts output tokens a server's ``usage`` does not."""
