"""Per-request sizes: what each request carries, decided before the run.

A ``RequestShape`` is the target-independent description of one request (rows of a
tensor batch, prompt and output tokens); each target encodes it for its protocol and
caches the encoding, so the hot path sends prepared bytes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestShape:
    items: int = 1
    """Rows in the request's tensors (the first, batch dimension)."""
    prompt_tokens: int = 0
    """Prompt length, for LLM targets."""
    output_tokens: int = 0
    """Requested output length (max_tokens), for LLM targets."""


DEFAULT_SHAPE = RequestShape()
