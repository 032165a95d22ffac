#!/usr/bin/env bash
# Oort-style guided selection against uniform sampling, side by side (issue 16): the same
# non-IID Fashion-MNIST federation (20 clients, Dirichlet 0.5 label skew, 5 a round)
# on the same device trace (compute slowdowns log-uniform in [1, 10], `cleave trace`),
# run by `cleave local` (real processes: emulated slow devices wait in parallel), once
# per arm:
#   uniform:   clients.selection: uniform;
#   oort:      clients.selection: oort with its defaults (the pacer every 5 rounds);
#   nopacer:   oort without the pacer (clients.oort_pacer_rounds: 0; T stays the median);
#   rest:      oort with the pacer and clients.oort_max_picks: 12.
# Prints each run's time to each target accuracy (the first round at or above it, by
# the run's elapsed_s) and the ratio to uniform.
#   bench/oort.sh [TARGETS] [ROUNDS] [ARMS]   # defaults 0.75,0.80,0.82, 40, "uniform oort nopacer rest"
set -euo pipefail
cd "$(dirname "$0")/.."
targets=${1:-0.75,0.80,0.82}
rounds=${2:-40}
arms=${3:-uniform oort nopacer rest}
bin=build/bin
work=$(mktemp -d /tmp/cleave-oort-XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
"$bin/cleave" trace --clients 20 --speed-spread 10 --seed 7 --out "$work/trace.csv" >/dev/null
for arm in $arms; do
  case $arm in
    uniform) selection="selection: uniform" ;;
    oort) selection="selection: oort" ;;
    nopacer) selection="selection: oort, oort_pacer_rounds: 0" ;;
    rest) selection="selection: oort, oort_max_picks: 12" ;;
    *) echo "unknown arm $arm" >&2; exit 2 ;;
  esac
  cat > "$work/$arm.yaml" <<YAML
run: {name: oort-bench-$arm, rounds: $rounds, seed: 42}
model: {name: lenet5}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 2000}
clients: {min: 20, per_round: 5, quorum: 1.0, round_deadline_s: 600, $selection}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist", partition: "dirichlet:0.5",
        partition_seed: 42, clients: 20, trace: $work/trace.csv}
YAML
  "$bin/cleave" local --insecure --config "$work/$arm.yaml" --run-dir "$work/$arm" > "$work/$arm.out"
done
/usr/bin/python3 - "$work" "$targets" $arms <<'PY'
import json, sys
work, targets, arms = sys.argv[1], [float(t) for t in sys.argv[2].split(",")], sys.argv[3:]
runs = {}
for arm in arms:
    rows = [json.loads(l) for l in open(f"{work}/{arm}/metrics.jsonl")]
    runs[arm] = rows = [r for r in rows if not r.get("evaluation_only")]
    last5 = sum(r["test_accuracy"] for r in rows[-5:]) / len(rows[-5:])
    print(f"{arm:8s} final accuracy {rows[-1]['test_accuracy']:.4f} (last 5 rounds {last5:.4f}) "
          f"after {len(rows)} rounds; mean round {sum(r['wall_s'] for r in rows) / len(rows):.2f} s")
for target in targets:
    hit = {a: next((r for r in runs[a] if r["test_accuracy"] >= target), None) for a in runs}
    parts = []
    for a in arms:
        h = hit[a]
        text = f"{h['elapsed_s']:6.1f} s (round {h['round']})" if h else "not reached"
        if a != "uniform" and "uniform" in hit:
            text += (f" {hit['uniform']['elapsed_s'] / h['elapsed_s']:.2f}x"
                     if h and hit["uniform"] else " n/a")
        parts.append(f"{a} {text}")
    print(f"to {target:.0%}: " + ", ".join(parts) + " (target >= 1.5x)")
if "uniform" in runs:
    for a in arms:
        if a == "uniform":
            continue
        d = 100 * (runs[a][-1]["test_accuracy"] - runs["uniform"][-1]["test_accuracy"])
        l5 = {x: sum(r["test_accuracy"] for r in runs[x][-5:]) / len(runs[x][-5:]) for x in (a, "uniform")}
        print(f"final accuracy {a} - uniform: {d:+.2f} points, mean of the last 5 rounds "
              f"{100 * (l5[a] - l5['uniform']):+.2f} (target within 0.5)")
PY
