#!/usr/bin/env bash
# Buffered asynchronous aggregation (FedBuff) against synchronous rounds with a
# deadline, side by side (issue 17): one non-IID Fashion-MNIST federation (20 clients,
# Dirichlet 0.5 label skew, LeNet-5, one local epoch) on one device trace with a 10x
# compute-speed spread (`cleave trace --speed-spread 10`: slowdowns log-uniform in
# [1, 10]), run by `cleave local` (real processes; emulated slow devices wait in
# parallel):
#   sync:  10 clients a round, the round closes at its deadline (quorum 0.5);
#   async: 10 clients training at once, a version every 5 updates, polynomial staleness.
# The async run gets as many client updates as the sync run committed (rounds =
# updates / 5). Prints each run's time to each target accuracy (the first line at or
# above it; time from the first round's start, so the processes' start-up and the wait
# for all 20 clients, the same for both, are left out), the ratio, and the final
# accuracies.
#   bench/fedbuff.sh [TARGETS] [SYNC_ROUNDS] [DEADLINE_S]   # defaults 0.80,0.83,0.85 40 6
set -euo pipefail
cd "$(dirname "$0")/.."
targets=${1:-0.80,0.83,0.85}
rounds=${2:-40}
deadline=${3:-6}
bin=build/bin
work=$(mktemp -d /tmp/cleave-fedbuff-XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
"$bin/cleave" trace --clients 20 --speed-spread 10 --seed 7 --out "$work/trace.csv" >/dev/null
common() {  # run name, rounds
  cat <<YAML
run: {name: fedbuff-bench-$1, rounds: $2, seed: 42}
model: {name: lenet5}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 2000}
train: {local_epochs: 1, batch_size: 32, lr: 0.02, momentum: 0.9}
server: {final_evaluation: false}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist", partition: "dirichlet:0.5",
        partition_seed: 42, clients: 20, trace: $work/trace.csv}
YAML
}
{ common sync "$rounds"
  echo "clients: {min: 20, per_round: 10, quorum: 0.5, round_deadline_s: $deadline}"
} > "$work/sync.yaml"
"$bin/cleave" local --insecure --config "$work/sync.yaml" --run-dir "$work/sync" > "$work/sync.out"
updates=$(/usr/bin/python3 -c "import json,sys; print(sum(json.loads(l)['participants'] for l in open(sys.argv[1]) if 'evaluation_only' not in l))" "$work/sync/metrics.jsonl")
{ common async $(( (updates + 4) / 5 ))
  echo "clients: {min: 20, round_deadline_s: 600}"
  echo "scheduler: {mode: async, buffer_size: 5, concurrency: 10, max_staleness: 10,"
  echo "            staleness: polynomial, staleness_exponent: 0.5}"
} > "$work/async.yaml"
"$bin/cleave" local --insecure --config "$work/async.yaml" --run-dir "$work/async" > "$work/async.out"
/usr/bin/python3 - "$work" "$targets" <<'PY'
import json, sys
work, targets = sys.argv[1], [float(t) for t in sys.argv[2].split(",")]
runs = {}
for mode in ("sync", "async"):
    rows = [json.loads(l) for l in open(f"{work}/{mode}/metrics.jsonl")]
    rows = runs[mode] = [r for r in rows if not r.get("evaluation_only")]
    t0 = rows[0]["elapsed_s"] - rows[0]["wall_s"]  # when its first round started
    for r in rows:
        r["t"] = r["elapsed_s"] - t0
    updates = sum(r["participants"] for r in rows)
    extra = ""
    if mode == "async":
        st = [r["staleness_mean"] for r in rows]
        extra = f"; mean staleness {sum(st) / len(st):.2f}, max {max(r['staleness_max'] for r in rows)}"
    else:
        extra = f"; {sum(r['failures'] for r in rows)} updates cut by the deadline"
    last5 = sum(r["test_accuracy"] for r in rows[-5:]) / len(rows[-5:])
    print(f"{mode:5s} final accuracy {rows[-1]['test_accuracy']:.4f} (last 5 lines {last5:.4f}) "
          f"after {len(rows)} lines, "
          f"{updates} client updates, {rows[-1]['t']:.1f} s{extra}")
for target in targets:
    hit = {m: next((r for r in runs[m] if r["test_accuracy"] >= target), None) for m in runs}
    text = {m: f"{h['t']:6.1f} s (line {h['round']})" if h else "not reached"
            for m, h in hit.items()}
    ratio = (f"{hit['sync']['t'] / hit['async']['t']:.2f}x"
             if hit["sync"] and hit["async"] else "n/a")
    print(f"to {target:.0%}: sync {text['sync']}, async {text['async']}: "
          f"sync / async {ratio} (target >= 2x at 85 %)")
final = {m: runs[m][-1]["test_accuracy"] for m in runs}
last5 = {m: sum(r["test_accuracy"] for r in runs[m][-5:]) / len(runs[m][-5:]) for m in runs}
print(f"final accuracy async - sync: {100 * (final['async'] - final['sync']):+.2f} points, "
      f"mean of the last 5 lines {100 * (last5['async'] - last5['sync']):+.2f} (target within 0.5)")
PY
