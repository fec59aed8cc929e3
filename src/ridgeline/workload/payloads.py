"""Per-request sizes: what each request carries, decided before the run.

A ``RequestShape`` is the target-independent description of one request (rows of a
tensor batch, prompt and output tokens); each target encodes it for its protocol and
caches the encoding, so the hot path sends prepared bytes.

Shapes for a run come from a recorded trace (``shapes_from_trace``), one fixed shape
(``fixed_shapes``), or seeded draws from small size distributions (``sampled_shapes``
with ``FixedSize``, ``UniformSize`` or ``LognormalSize`` per field). ``parse_size``
reads a size as the command line writes it: ``256``, ``uniform:64-512``,
``lognormal:mean=256,cv=0.5[,min=1][,max=2048]``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from ridgeline._registry import Registry
from ridgeline.errors import ConfigError
from ridgeline.workload.traces import Trace

Counts = NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class RequestShape:
    items: int = 1
    """Rows in the request's tensors (the first, batch dimension)."""
    prompt_tokens: int = 0
    """Prompt length, for LLM targets."""
    output_tokens: int = 0
    """Requested output length (max_tokens), for LLM targets."""
    prompt: str | None = None
    """The prompt's text (``prompt_tokens`` of it under the run's tokenizer); None: the
    target makes ``prompt_tokens`` words of its own."""
    history: tuple[str, ...] = ()
    """Earlier turns of a conversation, oldest first, alternately the user's and the
    assistant's: a chat target sends them as messages before ``prompt``, a completions
    target joins them, each and ``prompt`` apart by a blank line (``prompt_text``)."""

    def prompt_text(self) -> str:
        """The whole text a completions request carries: the history, then the prompt."""
        if not self.history:
            return self.prompt or ""
        return TURN_SEPARATOR.join((*self.history, self.prompt or ""))


TURN_SEPARATOR = "\n\n"


DEFAULT_SHAPE = RequestShape()


MAX_SIZE = 1 << 20
"""The largest per-request size a spec may give (tokens, rows): 1,048,576, past any
model's context; a prompt of 6 million tokens made for each request took 20 GB before
a single one was sent."""


class FixedSize(BaseModel):
    """Every request gets ``value``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["fixed"] = "fixed"
    value: int = Field(ge=0, le=MAX_SIZE, description="the size of every request")

    def draw(self, n: int, rng: np.random.Generator) -> Counts:
        return np.full(n, self.value, dtype=np.int64)

    def smallest(self) -> int:
        return self.value


class UniformSize(BaseModel):
    """Sizes drawn uniformly from the integers ``low..high`` (both included)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["uniform"] = "uniform"
    low: int = Field(ge=0, le=MAX_SIZE, description="smallest size")
    high: int = Field(ge=0, le=MAX_SIZE, description="largest size (≥ low)")

    @model_validator(mode="after")
    def _ordered(self) -> UniformSize:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be ≥ low ({self.low})")
        return self

    def draw(self, n: int, rng: np.random.Generator) -> Counts:
        return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)

    def smallest(self) -> int:
        return self.low


class LognormalSize(BaseModel):
    """Lognormal sizes with the given mean and coefficient of variation, rounded to
    integers and clipped to ``[low, high]`` (the long right tail of prompt lengths)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["lognormal"] = "lognormal"
    mean: float = Field(
        gt=0, le=MAX_SIZE, allow_inf_nan=False, description="mean size before clipping"
    )
    cv: float = Field(gt=0, allow_inf_nan=False, description="std / mean before clipping")
    low: int = Field(1, ge=0, le=MAX_SIZE, description="smallest size kept")
    high: int | None = Field(
        None, ge=0, le=MAX_SIZE, description=f"largest size kept (none: {MAX_SIZE:,})"
    )

    def draw(self, n: int, rng: np.random.Generator) -> Counts:
        sigma2 = math.log1p(self.cv**2)
        raw = rng.lognormal(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2), size=n)
        top = MAX_SIZE if self.high is None else self.high
        return np.clip(np.rint(raw), self.low, top).astype(np.int64)

    def smallest(self) -> int:
        return self.low


SizeSpec = Annotated[FixedSize | UniformSize | LognormalSize, Field(discriminator="kind")]
"""A distribution of one per-request size; ``kind`` selects the class."""

SizeLike = int | FixedSize | UniformSize | LognormalSize | Mapping[str, Any]
"""A size: a constant, a spec, or a spec as a mapping (from YAML)."""

_SIZE_ADAPTER: TypeAdapter[SizeSpec] = TypeAdapter(SizeSpec)
_SIZE_KINDS: Registry[type[Any]] = Registry.of_union("size kind", SizeSpec)
_MINIMUM = {"items": 1, "prompt_tokens": 0, "output_tokens": 0}


def fixed_shapes(n: int, shape: RequestShape = DEFAULT_SHAPE) -> list[RequestShape]:
    """``n`` requests all of one shape."""
    return [shape] * n


def shapes_from_trace(trace: Trace) -> list[RequestShape]:
    """One shape per request of a trace, from its ``items``, ``prompt_tokens`` and
    ``output_tokens`` columns (``RequestShape``'s defaults where a column is absent)."""
    n = len(trace)
    columns = {
        name: trace.columns[name].tolist() if name in trace.columns else [default] * n
        for name, default in (("items", 1), ("prompt_tokens", 0), ("output_tokens", 0))
    }
    rows = zip(columns["items"], columns["prompt_tokens"], columns["output_tokens"], strict=True)
    return [RequestShape(items, prompt, output) for items, prompt, output in rows]


def sampled_shapes(
    n: int,
    seed: int = 0,
    items: SizeLike = 1,
    prompt_tokens: SizeLike = 0,
    output_tokens: SizeLike = 0,
) -> list[RequestShape]:
    """``n`` shapes with sizes drawn independently per request from seeded distributions.

    Each size field has its own random stream (from ``seed`` and the field), so changing
    one field's spec leaves the others' draws as they were.
    """
    if n < 0 or seed < 0:
        raise ConfigError(f"n and seed must be ≥ 0, got n={n}, seed={seed}")
    drawn = []
    for stream, (name, like) in enumerate(
        (("items", items), ("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens))
    ):
        spec = _size_spec(name, like)
        drawn.append(spec.draw(n, np.random.default_rng([seed, stream])).tolist())
    return [RequestShape(i, p, o) for i, p, o in zip(*drawn, strict=True)]


def _size_spec(name: str, like: SizeLike) -> FixedSize | UniformSize | LognormalSize:
    if isinstance(like, bool):
        raise ConfigError(f"{name} must be an integer or a size spec, got {like!r}")
    if isinstance(like, Mapping):
        _SIZE_KINDS.get(str(like.get("kind")))  # an unknown kind lists the valid ones
    try:
        spec = (
            FixedSize(value=like) if isinstance(like, int) else _SIZE_ADAPTER.validate_python(like)
        )
    except ValidationError as exc:
        problems = "; ".join(
            ": ".join(filter(None, (".".join(map(str, e["loc"][1:])), e["msg"])))
            for e in exc.errors()
        )
        raise ConfigError(f"{name} size spec {like!r} is invalid: {problems}") from None
    if spec.smallest() < _MINIMUM[name]:
        raise ConfigError(
            f"{name} must be ≥ {_MINIMUM[name]}, but its spec allows {spec.smallest()}: {spec!r}"
        )
    return spec


SIZE_GRAMMAR = "N, fixed:N, uniform:LOW-HIGH or lognormal:mean=M,cv=C[,min=LOW][,max=HIGH]"
_LOGNORMAL_KEYS = {"mean": "mean", "cv": "cv", "min": "low", "max": "high"}


def parse_size(text: str, name: str) -> FixedSize | UniformSize | LognormalSize:
    """A size as written on the command line (``SIZE_GRAMMAR``), checked as ``name``'s
    (``prompt_tokens``, ``output_tokens`` or ``items``); an error names its option."""
    flag = f"--{name.replace('_', '-')}"
    kind, colon, rest = text.strip().partition(":")
    kind = kind.strip().lower()
    try:
        like: SizeLike
        if not colon and kind.isdigit():
            like = int(kind)
        elif kind == "fixed" and rest.strip().isdigit():
            like = int(rest)
        elif kind == "uniform" and rest.count("-") == 1:
            low, high = (int(v) for v in rest.split("-"))
            like = {"kind": "uniform", "low": low, "high": high}
        elif kind == "lognormal":
            like = {"kind": "lognormal", **_lognormal_fields(rest)}
        else:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{flag} {text!r} does not parse; write {SIZE_GRAMMAR}") from None
    try:
        return _size_spec(name, like)
    except ConfigError as exc:
        raise ConfigError(f"{flag} {text!r}: {exc}") from None


def _lognormal_fields(rest: str) -> dict[str, float]:
    fields: dict[str, float] = {}
    for part in rest.split(","):
        key, eq, value = part.partition("=")
        field = _LOGNORMAL_KEYS.get(key.strip().lower())
        if not eq or field is None or field in fields:
            raise ValueError
        number = float(value)
        fields[field] = int(number) if field in ("low", "high") and number.is_integer() else number
    return fields
