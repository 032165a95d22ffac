#!/usr/bin/env bash
# Oort-style guided selection against uniform sampling, side by side (issue 16): the same
# non-IID Fashion-MNIST federation (20 clients, Dirichlet 0.5 label skew, 5 a round)
# on the same device trace (compute slowdowns log-uniform in [1, 10], `cleave trace`),
# run by `cleave local` (real processes: emulated slow devices wait in parallel), once
# with clients.selection: uniform and once with oort. Prints each run's time to the
# target accuracy (the first round at or above it, by the run's elapsed_s) and the ratio.
#   bench/oort.sh [TARGET] [ROUNDS]      # defaults 0.75 and 40
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-0.75}
rounds=${2:-40}
bin=build/bin
work=$(mktemp -d /tmp/cleave-oort-XXXXXX)
trap 'rm -rf "$work"' EXIT
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
/usr/bin/python3 - "$work" "$target" <<'PY'
import json, sys
work, target = sys.argv[1], float(sys.argv[2])
res = {}
for sel in ("uniform", "oort"):
    rows = [json.loads(l) for l in open(f"{work}/{sel}/metrics.jsonl")]
    rows = [r for r in rows if not r.get("evaluation_only")]
    hit = next((r for r in rows if r["test_accuracy"] >= target), None)
    res[sel] = (hit["elapsed_s"] if hit else None, hit["round"] if hit else None,
                rows[-1]["test_accuracy"], sum(r["wall_s"] for r in rows) / len(rows))
    t, rnd, final, wall = res[sel]
    print(f"{sel:8s} time to {target:.0%}: " + (f"{t:6.1f} s (round {rnd})" if t else "not reached") +
          f"; final accuracy {final:.4f} after {len(rows)} rounds; mean round {wall:.2f} s")
u, o = res["uniform"][0], res["oort"][0]
if u and o:
    print(f"uniform / oort time to {target:.0%}: {u / o:.2f}x (target >= 1.5x); "
          f"final accuracy oort - uniform: {100 * (res['oort'][2] - res['uniform'][2]):+.2f} points")
PY
