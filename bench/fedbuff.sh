#!/usr/bin/env bash
# Buffered asynchronous aggregation (FedBuff) against synchronous rounds with a
# deadline, side by side (issue 17): one non-IID Fashion-MNIST federation (20 clients,
# Dirichlet 0.5 label skew, LeNet-5, one local epoch) on one device trace with a 10x
# compute-speed spread (`cleave trace --speed-spread 10`: slowdowns log-uniform in
# [1, 10]), run by `cleave local` (real processes; emulated slow devices wait in
# parallel):
#   sync:  10 clients a round, the round closes at its deadline (quorum 0.5);
#   async: 10 clients training at once, a version every 5 updates, polynomial staleness;
#   control: async with staleness control (scheduler.target_staleness: 2, local steps
#            sized per client from its measured speed).
# The async runs get as many client updates as the sync run committed (rounds =
# updates / 5). Prints each run's time to each target accuracy (the first line at or
# above it; time from the first round's start, so the processes' start-up and the wait
# for all 20 clients, the same for all, are left out), the ratios, the final
# accuracies and the async runs' staleness.
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
for mode in async control; do
  { common $mode $(( (updates + 4) / 5 ))
    echo "clients: {min: 20, round_deadline_s: 600}"
    echo "scheduler: {mode: async, buffer_size: 5, concurrency: 10, max_staleness: 10,"
    control=""
    [ $mode = control ] && control=", target_staleness: 2"
    echo "            staleness: polynomial, staleness_exponent: 0.5$control}"
  } > "$work/$mode.yaml"
  "$bin/cleave" local --insecure --config "$work/$mode.yaml" --run-dir "$work/$mode" > "$work/$mode.out"
done
/usr/bin/python3 - "$work" "$targets" <<'PY'
import json, sys
work, targets = sys.argv[1], [float(t) for t in sys.argv[2].split(",")]
runs = {}
for mode in ("sync", "async", "control"):
    rows = [json.loads(l) for l in open(f"{work}/{mode}/metrics.jsonl")]
    rows = runs[mode] = [r for r in rows if not r.get("evaluation_only")]
    t0 = rows[0]["elapsed_s"] - rows[0]["wall_s"]  # when its first round started
    for r in rows:
        r["t"] = r["elapsed_s"] - t0
    updates = sum(r["participants"] for r in rows)
    extra = ""
    if mode != "sync":
        st = [r["staleness_mean"] * r["participants"] for r in rows]
        steps = [r["local_steps"]["mean"] * r["participants"] for r in rows]
        over = lambda b: 100 * sum(n for r in rows for s, n in r["staleness"].items() if int(s) > b) / updates
        extra = (f"; mean staleness {sum(st) / updates:.2f}, max {max(r['staleness_max'] for r in rows)}, "
                 f"above 2: {over(2):.1f} %, above 4: {over(4):.1f} %; "
                 f"local steps mean {sum(steps) / updates:.1f}, "
                 f"min {min(r['local_steps']['min'] for r in rows)}")
    else:
        extra = f"; {sum(r['failures'] for r in rows)} updates cut by the deadline"
    last5 = sum(r["test_accuracy"] for r in rows[-5:]) / len(rows[-5:])
    print(f"{mode:7s} final accuracy {rows[-1]['test_accuracy']:.4f} (last 5 lines {last5:.4f}) "
          f"after {len(rows)} lines, "
          f"{updates} client updates, {rows[-1]['t']:.1f} s{extra}")
for target in targets:
    hit = {m: next((r for r in runs[m] if r["test_accuracy"] >= target), None) for m in runs}
    text = {m: f"{h['t']:6.1f} s (line {h['round']})" if h else "not reached"
            for m, h in hit.items()}
    ratio = {m: f"{hit['sync']['t'] / hit[m]['t']:.2f}x" if hit["sync"] and hit[m] else "n/a"
             for m in ("async", "control")}
    print(f"to {target:.0%}: sync {text['sync']}, async {text['async']}, control {text['control']}: "
          f"sync / async {ratio['async']}, sync / control {ratio['control']} (target >= 2x at 85 %)")
final = {m: runs[m][-1]["test_accuracy"] for m in runs}
last5 = {m: sum(r["test_accuracy"] for r in runs[m][-5:]) / len(runs[m][-5:]) for m in runs}
for m in ("async", "control"):
    print(f"final accuracy {m} - sync: {100 * (final[m] - final['sync']):+.2f} points, "
          f"mean of the last 5 lines {100 * (last5[m] - last5['sync']):+.2f} (target within 0.5)")
PY
