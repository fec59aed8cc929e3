"""Prompts of an exact token count, unique per request unless they share a prefix.

``make_prompts(tokenizer, counts, seed)`` gives request ``i`` a text of exactly
``counts[i]`` tokens under ``tokenizer``: words drawn from a fixed list by a generator
seeded with ``(seed, i)``. Under a word-additive tokenizer (GPT-2's; checked once per
tokenizer, see ``_openers``) n words are n tokens; under any other the words are cut to
the count in token space and the cut text is checked by encoding it again. Prompts of
one length therefore differ (a server's prefix cache cannot serve one from another), and
the same seed makes the same prompts. With
``shared_prefix=P`` every prompt opens with the same P tokens (the same whatever the
seed, so every step of a probe shares it, as a system prompt would) and the rest is its
own.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from ridgeline.errors import ConfigError, TokenizerError
from ridgeline.workload.tokenizer import Tokenizer

_NOUNS = """
time year people way day man thing woman life child world school state family student
group country problem hand part place case week company system program question work
government number night point home water room mother area money story fact month lot
right study book eye job word business issue side kind head house service friend father
power hour game line end member law car city community name president team minute idea
kid body information back parent face others level office door health person art war
history party result change morning reason research girl guy moment air teacher force
education foot boy age policy process music market sense nation plan college interest
death experience effect use class control care field development role effort rate heart
drug show leader light voice wife police mind price report decision son view
relationship town road arm difference value building action model season society tax
director position player record paper space ground form event official matter center
couple site project activity star table need court oil situation cost industry figure
street image phone data picture practice piece land product doctor wall patient worker
news test movie north love support technology step baby computer type attention film
tree source organization hair window evidence population truth song cell garden river
bridge stone cloud
"""
WORDS = tuple(_NOUNS.split())
"""Common English nouns: under GPT-2 each, with its leading space, is one token."""

_TRIES = 8
_LAW_WORDS = 4096
_PREFIX_SEED = 1 << 32


def make_prompts(
    tokenizer: Tokenizer, counts: Sequence[int], seed: int = 0, shared_prefix: int = 0
) -> list[str]:
    """One prompt per count, ``counts[i]`` tokens each (0 gives the empty text)."""
    if shared_prefix < 0:
        raise ConfigError(f"--shared-prefix must be ≥ 0 tokens, got {shared_prefix}")
    short = [n for n in counts if 0 < n < shared_prefix]
    if short:
        raise ConfigError(
            f"--shared-prefix {shared_prefix} is longer than a prompt of {min(short)} tokens; "
            "lower it, or raise the smallest prompt length"
        )
    head = ""
    if shared_prefix:
        head = exact_prompt(tokenizer, shared_prefix, np.random.default_rng(_PREFIX_SEED))
    return [
        exact_prompt(tokenizer, n, np.random.default_rng([seed, i]), head) if n else ""
        for i, n in enumerate(counts)
    ]


def exact_prompt(tokenizer: Tokenizer, n: int, rng: np.random.Generator, head: str = "") -> str:
    """A text of exactly ``n`` tokens that opens with ``head`` (itself at most ``n``
    tokens), the rest seeded words; raises TokenizerError when the tokenizer cannot be
    made to give that count (a merge across the cut every time)."""
    head_ids = tokenizer.encode(head) if head else []
    if len(head_ids) > n:
        raise ConfigError(f"a prompt's shared prefix ({len(head_ids)} tokens) exceeds its {n}")
    if len(head_ids) == n:
        return head
    openers = _openers(tokenizer)
    if openers:  # GPT-2 and its kin: n words are n tokens (the law _openers checked)
        words = rng.integers(0, len(WORDS), size=n - len(head_ids))
        if not head:  # the first word has no space before it: one token so too
            words[0] = openers[int(rng.integers(len(openers)))]
        return _joined(head, words)
    for _ in range(_TRIES):
        ids = tokenizer.encode(_joined(head, rng.integers(0, len(WORDS), n - len(head_ids) + 8)))
        while len(ids) < n:  # a tokenizer with more than one token a word needs fewer words
            ids += tokenizer.encode(" " + WORDS[int(rng.integers(len(WORDS)))])
        cut = tokenizer.decode(ids[:n])
        again = tokenizer.encode(cut)
        if len(again) == n and again[: len(head_ids)] == head_ids:
            return cut
    raise TokenizerError(
        f"tokenizer {tokenizer.name} gives no text of exactly {n} tokens from words (the "
        f"cut merged with its neighbour {_TRIES} times); try another length or --tokenizer"
    )


def _joined(head: str, words: np.ndarray) -> str:
    """``head`` and the words, one space before each but a first word of an empty head."""
    text = " ".join(map(WORDS.__getitem__, words.tolist()))
    return f"{head} {text}" if head and text else head or text


@lru_cache(maxsize=8)
def _openers(tokenizer: Tokenizer) -> tuple[int, ...]:
    """The words that are one token at the start of a text, when the tokenizer is
    *word-additive*: every listed word is one token after a space, and a seeded text of
    ``_LAW_WORDS`` words (an opener first) encodes to exactly that many tokens. Such a
    tokenizer (GPT-2's byte-level BPE: its pre-tokenizer splits before every space, so
    no merge crosses one) makes a prompt of n tokens from n words with no encoding per
    prompt: re-encoding a 2,000-token prompt costs ~10 ms, which a step of a thousand
    requests would pay before it starts. Empty otherwise: prompts are then cut to length
    in token space and each checked by encoding it again."""
    if any(len(tokenizer.encode(" " + w)) != 1 for w in WORDS):
        return ()
    openers = tuple(k for k, w in enumerate(WORDS) if len(tokenizer.encode(w)) == 1)
    if not openers:
        return ()
    rng = np.random.default_rng(_PREFIX_SEED)
    words = rng.integers(0, len(WORDS), size=_LAW_WORDS)
    words[0] = openers[0]
    text = _joined("", words)
    return openers if len(tokenizer.encode(text)) == _LAW_WORDS else ()
