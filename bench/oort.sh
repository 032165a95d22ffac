#!/usr/bin/env bash
# Oort-style guided selection against uniform sampling, side by side (issue 16): the same
# non-IID Fashion-MNIST federation (20 clients, Dirichlet 0.5 label skew, 5 a round)
# on the same device trace (compute slowdowns log-uniform in [1, 10], `cleave trace`),
# run by `cleave local` (real processes: emulated slow devices wait in parallel), once
# with clients.selection: uniform and once with oort. Prints each run's time to each
# target accuracy (the first round at or above it, by the run's elapsed_s) and the ratio.
#   bench/oort.sh [TARGETS] [ROUNDS]      # defaults 0.75,0.80,0.82 and 40
set -euo pipefail
cd "$(dirname "$0")/.."
targets=${1:-0.75,0.80,0.82}
rounds=${2:-40}
bin=build/bin
work=$(mktemp -d /tmp/cleave-oort-XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
"$bin/cleave" trace --clients 20 --speed-spread 10 --seed 7 --out "$work/trace.csv" >/dev/null
for selection in uniform oort; do
  cat > "$work/$selection.yaml" <<YAML
run: {name: oort-bench-$selection, rounds: $rounds, seed: 42}
model: {name: lenet5}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 2000}
clients: {min: 20, per_round: 5, quorum: 1.0, round_deadline_s: 600, selection: $selection}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist", partition: "dirichlet:0.5",
        partition_seed: 42, clients: 20, trace: $work/trace.csv}
YAML
  "$bin/cleave" local --insecure --config "$work/$selection.yaml" --run-dir "$work/$selection" \
    > "$work/$selection.out"
done
/usr/bin/python3 - "$work" "$targets" <<'PY'
import json, sys
work, targets = sys.argv[1], [float(t) for t in sys.argv[2].split(",")]
runs = {}
for sel in ("uniform", "oort"):
    rows = [json.loads(l) for l in open(f"{work}/{sel}/metrics.jsonl")]
    runs[sel] = [r for r in rows if not r.get("evaluation_only")]
    rows = runs[sel]
    print(f"{sel:8s} final accuracy {rows[-1]['test_accuracy']:.4f} after {len(rows)} rounds; "
          f"mean round {sum(r['wall_s'] for r in rows) / len(rows):.2f} s")
for target in targets:
    hit = {s: next((r for r in runs[s] if r["test_accuracy"] >= target), None) for s in runs}
    text = {s: f"{h['elapsed_s']:6.1f} s (round {h['round']})" if h else "not reached"
            for s, h in hit.items()}
    ratio = (f"{hit['uniform']['elapsed_s'] / hit['oort']['elapsed_s']:.2f}x"
             if hit["uniform"] and hit["oort"] else "n/a")
    print(f"to {target:.0%}: uniform {text['uniform']}, oort {text['oort']}: "
          f"uniform / oort {ratio} (target >= 1.5x)")
final = {s: runs[s][-1]["test_accuracy"] for s in runs}
print(f"final accuracy oort - uniform: {100 * (final['oort'] - final['uniform']):+.2f} points "
      "(target within 0.5)")
PY
