#!/bin/bash
# The README's serve-then-probe example (issue 32) on a fresh clone of this repository:
# `make`'s set-up, `ridgeline serve examples/plans/traffic-cpu.yaml`, then
# `ridgeline probe URL --slo "p99<400ms,errors<1%" --budget 8m` over HTTP and gRPC, each
# answer then checked by a 60 s step at the capacity it reported (holds: p99 < 400 ms,
# errors < 1 %, a valid step). Prints one line per probe and per check; some 18 minutes.
# Usage: benchmarks/readme_probe.sh [CLONE_DIR]   (default: a new temporary folder)
set -u
SRC=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
D=${1:-$(mktemp -d)/ridgeline}
rm -rf "$D"; git clone -q "$SRC" "$D"; cd "$D" || exit 1
echo "commit $(git log --oneline -1)"
export RIDGELINE_DB=$D/runs.sqlite
make .venv/.installed >/dev/null 2>&1 || { echo "set-up failed"; exit 1; }
. .venv/bin/activate
ridgeline models build >/dev/null
ridgeline serve examples/plans/traffic-cpu.yaml > serve.log 2>&1 &
SERVE=$!
trap 'kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null' EXIT
for _ in $(seq 120); do curl -sf http://127.0.0.1:8000/v2/health/ready >/dev/null && break; sleep 1; done
for url in http://127.0.0.1:8000/v2/models/traffic grpc://127.0.0.1:8001/traffic; do
  name=${url%%:*}
  t0=$(date +%s.%N)
  ridgeline probe "$url" --slo "p99<400ms,errors<1%" --budget 8m --json > "$name.json" 2> "$name.err"
  rc=$?
  t1=$(date +%s.%N)
  python3 - "$name" "$rc" "$t0" "$t1" <<'PY'
import json, sys
name, rc, t0, t1 = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
r = json.load(open(f"{name}.json"))
print(f"{name} probe: exit {rc}, {t1 - t0:.0f} s wall, capacity {r['capacity_rps']}, "
      f"interval [{r['ci_low']}, {r['ci_high']}], confirmed {r['confirmed']}, valid {r['valid']}, "
      f"{r['requests_sent']} requests")
print(f"  reason: {r['reason'][:400]}")
PY
  cap=$(python3 -c "import json; print(json.load(open('$name.json'))['capacity_rps'])")
  [ "$cap" = "None" ] && continue
  ridgeline run "$url" --rate "$cap" --duration 60 --json > "${name}_check.json" 2>/dev/null
  python3 - "$name" "$cap" <<'PY'
import json, sys
name, cap = sys.argv[1], sys.argv[2]
s = json.load(open(f"{name}_check.json"))
s = s.get("summary", s)
ok = s["latency_ms"]["p99"] < 400 and s["error_rate"] < 0.01 and s["valid"]
print(f"  60 s check at {cap}: {'HOLDS' if ok else 'FAILS'}, p99 {s['latency_ms']['p99']} ms, "
      f"error rate {s['error_rate']}, {s['sent']} sent, valid {s['valid']}")
PY
done
