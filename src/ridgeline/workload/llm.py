"""An LLM workload: each request's prompt (text and tokens) and output length.

``LlmWorkload`` is the one declaration of what ``run`` and ``probe`` send to a generative
endpoint: prompt and output lengths as fixed values or distributions, or a dataset
(``workload.datasets``), the tokenizer that counts and makes prompts
(``workload.tokenizer``), and an optional prefix every made prompt shares. Its
``shapes(n, seed)`` are a step's requests, made before the step runs: made prompts are
exact to the token and unique per request (``workload.prompts``); dataset prompts are
taken in file order, the dataset cycling when a step needs more requests than it holds.

Multi-turn conversations (``multi_turn``) become successive requests, a conversation's
turns in order, each carrying the earlier turns' prompts and *recorded* answers as its
history: an open-loop step sends every turn at its scheduled time whether or not the
previous turn has been answered, so a turn's text cannot depend on a live answer.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field

from ridgeline.errors import ConfigError
from ridgeline.workload.datasets import Dataset, DatasetFormat, read_dataset
from ridgeline.workload.payloads import RequestShape, SizeSpec, sampled_shapes
from ridgeline.workload.prompts import make_prompts
from ridgeline.workload.tokenizer import Tokenizer, load_tokenizer


class LlmWorkload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_tokens: SizeSpec | None = Field(
        None, description="prompt length per request (none: the trace's, or one word)"
    )
    output_tokens: SizeSpec | None = Field(
        None, description="output length per request (max_tokens; none: the target's 16)"
    )
    dataset: str | None = Field(
        None, description="a JSONL, ShareGPT JSON or trace file, or 'azure' (bundled)"
    )
    dataset_format: DatasetFormat = Field("auto", description="the dataset's format")
    multi_turn: bool = Field(False, description="every turn of a conversation, not the first")
    shared_prefix: int = Field(0, ge=0, description="tokens every made prompt opens with")
    tokenizer: str | None = Field(
        None, description="tokenizer.json or its directory, gpt2 or bytes (none: gpt2)"
    )

    def __init__(self, **data: object) -> None:
        """Fields validated by pydantic, then the options that contradict each other
        (a ``ConfigError`` naming both, not a validation error)."""
        super().__init__(**data)
        if self.dataset is not None and self.prompt_tokens is not None:
            raise ConfigError(
                "--dataset gives each request's prompt; leave out --prompt-tokens, or the dataset"
            )
        if self.dataset is None and self.multi_turn:
            raise ConfigError("--multi-turn replays a dataset's conversations: give --dataset")
        smallest = None if self.prompt_tokens is None else self.prompt_tokens.smallest()
        if smallest is not None and self.shared_prefix > smallest:
            raise ConfigError(
                f"--shared-prefix {self.shared_prefix} is longer than the shortest prompt "
                f"--prompt-tokens allows ({smallest}); lower it, or raise the shortest"
            )
        if self.dataset is not None and self.shared_prefix:
            raise ConfigError(
                "--shared-prefix shapes made prompts; a dataset's prompts are its own: "
                "leave out one of them"
            )

    @property
    def active(self) -> bool:
        """Does it change anything from the target's defaults?"""
        lengths = (self.prompt_tokens, self.output_tokens, self.dataset)
        return self.shared_prefix > 0 or any(v is not None for v in lengths)

    def check(self) -> None:
        """Load the tokenizer and read the dataset now: a path that is neither is named
        before any request is sent."""
        self._tokenizer()
        if self.dataset is not None:
            _dataset(self.dataset, self.dataset_format)

    def shapes(
        self, n: int, seed: int, base: list[RequestShape] | None = None, *, text: bool = True
    ) -> list[RequestShape] | None:
        """``n`` requests for a step seeded ``seed``; ``base`` (a trace's shapes) gives
        the lengths this workload does not set. ``text=False`` leaves prompts unmade (a
        simulated server reads lengths only). None when nothing is set."""
        if self.dataset is not None:
            return self._from_dataset(n, seed, text)
        if not self.active and base is None:
            return None
        sizes = sampled_shapes(
            n,
            seed,
            prompt_tokens=self.prompt_tokens or 0,
            output_tokens=self.output_tokens or 0,
        )
        shapes = [
            RequestShape(
                b.items,
                s.prompt_tokens if self.prompt_tokens is not None else b.prompt_tokens,
                s.output_tokens if self.output_tokens is not None else b.output_tokens,
            )
            for s, b in zip(sizes, base or [RequestShape()] * n, strict=True)
        ]
        return self._with_prompts(shapes, seed) if text else shapes

    def _with_prompts(self, shapes: list[RequestShape], seed: int) -> list[RequestShape]:
        if self.shared_prefix and not any(s.prompt_tokens for s in shapes):
            raise ConfigError(
                "--shared-prefix shapes made prompts, and these requests have no prompt "
                "length: give --prompt-tokens (or a trace with prompt lengths)"
            )
        texts = make_prompts(
            self._tokenizer(), [s.prompt_tokens for s in shapes], seed, self.shared_prefix
        )
        return [
            RequestShape(s.items, s.prompt_tokens, s.output_tokens, t or None)
            for s, t in zip(shapes, texts, strict=True)
        ]

    def _from_dataset(self, n: int, seed: int, text: bool) -> list[RequestShape]:
        assert self.dataset is not None
        requests = _dataset(self.dataset, self.dataset_format).requests(self.multi_turn)
        tok = self._tokenizer()
        outputs = sampled_shapes(n, seed, output_tokens=self.output_tokens or 0)
        shapes: list[RequestShape] = []
        for i in range(n):
            turn, history = requests[i % len(requests)]
            out = turn.output_tokens or (_count(tok, turn.answer) if turn.answer else 0)
            out = out or outputs[i].output_tokens
            if turn.prompt is None:  # a trace row: a prompt made to its length
                shapes.append(RequestShape(1, turn.prompt_tokens or 0, out))
                continue
            shape = RequestShape(1, 0, out, turn.prompt, history)
            tokens = _count(tok, shape.prompt_text())
            shapes.append(RequestShape(1, tokens, out, turn.prompt, history))
        made = [s for s in shapes if s.prompt is None and s.prompt_tokens]
        if made and text:
            texts = iter(make_prompts(tok, [s.prompt_tokens for s in made], seed))
            shapes = [
                RequestShape(1, s.prompt_tokens, s.output_tokens, next(texts))
                if s.prompt is None and s.prompt_tokens
                else s
                for s in shapes
            ]
        return shapes

    def _tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.tokenizer)


@lru_cache(maxsize=4)
def _dataset(path: str, fmt: DatasetFormat) -> Dataset:
    """Read once per process: a probe's every step draws from the same file."""
    return read_dataset(path, fmt)


@lru_cache(maxsize=65_536)
def _count(tokenizer: Tokenizer, text: str) -> int:
    """A dataset text's tokens, counted once: a probe's steps reuse the same entries."""
    return len(tokenizer.encode(text))
