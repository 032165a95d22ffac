#!/usr/bin/env bash
# Byzantine robustness: the 10-client Dirichlet(0.5) Fashion-MNIST setting (LeNet-5, one
# local epoch) with 2 attackers of each kind, aggregated by the mean (FedAvg) and by
# each robust rule, against the clean run. Prints a Markdown table of final accuracies.
#   bench/robust/attacks.sh [ROUNDS=10]
# One federation at a time (about 25 s each at 10 rounds); run directories go to
# runs/bench-robust-ROUNDS/. RULES and ATTACKS (space-separated) narrow the grid;
# SKIP_DONE=1 keeps runs that already completed; TABLE_ONLY=1 only prints the table of
# the runs already there. MAX_NORM (norm_bound, default 2.0) and M (multi_krum, default
# n - f) set those rules' parameters; runs with other values get their own directories
# (e.g. sign-flip-norm_bound-5.0). The binaries are copied first, so a
# rebuild meanwhile does not disturb the runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-10}
out=runs/bench-robust-$rounds
rules=(${RULES:-mean median trimmed_mean krum multi_krum norm_bound bulyan fltrust})
attacks=(${ATTACKS:-sign-flip gaussian label-flip alie ipm})
mkdir -p "$out"
source bench/common.sh
bench_bin  # copies of the binaries: a rebuild meanwhile does not disturb the runs

base() {
  cat <<YAML
run: {name: bench-robust, rounds: $rounds, seed: 42}
model: {name: lenet5}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist"}
clients: {min: 10, fraction: 1.0, quorum: 0.8, round_deadline_s: 300}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
strategy: {name: fedavg}
YAML
}

run() {  # run NAME AGGREGATION_YAML LOCAL_YAML
  local dir="$out/$1"
  if [ "${SKIP_DONE:-0}" = 1 ] && [ -f "$dir/metrics.jsonl" ] &&
     [ "$(wc -l < "$dir/metrics.jsonl")" -ge "$rounds" ]; then
    return
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  { base; echo "aggregation: $2"; echo "local: $3"; } > "$dir.yaml"
  # A run may fail (an attack can make the model diverge until rounds lose quorum): the
  # table then shows the last committed round's accuracy, marked.
  "$bin/cleave" local --config "$dir.yaml" --rounds "$rounds" --run-dir "$dir" > "$dir.log" 2>&1 ||
    echo "$1: cleave local failed, see $dir.log" >&2
}

max_norm=${MAX_NORM:-2.0}
m=${M:-0}
agg() {  # the aggregation section of a rule, tolerating 2 attackers where it can
  case "$1" in
    mean) echo "{rule: mean}" ;;
    norm_bound) echo "{rule: norm_bound, max_norm: $max_norm}" ;;
    multi_krum) echo "{rule: multi_krum, f: 2, m: $m}" ;;
    bulyan) echo "{rule: bulyan, f: 1}" ;;  # n >= 4f + 3: with 10 clients f = 1 at most
    fltrust) echo "{rule: fltrust, root_data: \"fmnist:/usr/share/datasets/fashion-mnist,limit=1000\"}" ;;
    *) echo "{rule: $1, f: 2}" ;;
  esac
}
name() {  # the run directory of attack $1 with rule $2
  case "$2" in
    norm_bound) [ "$max_norm" = 2.0 ] && echo "$1-$2" || echo "$1-$2-$max_norm" ;;
    multi_krum) [ "$m" = 0 ] && echo "$1-$2" || echo "$1-$2-m$m" ;;
    *) echo "$1-$2" ;;
  esac
}

if [ "${TABLE_ONLY:-0}" != 1 ]; then
  run clean "$(agg mean)" '{partition: "dirichlet:0.5", partition_seed: 42, clients: 10}'
  for a in "${attacks[@]}"; do
    for r in "${rules[@]}"; do
      run "$(name "$a" "$r")" "$(agg "$r")" \
        "{partition: \"dirichlet:0.5\", partition_seed: 42, clients: 10, attack: $a, attackers: 2}"
    done
  done
fi

names=()
for a in "${attacks[@]}"; do for r in "${rules[@]}"; do names+=("$(name "$a" "$r")"); done; done
python3 - "$out" "$rounds" "${#rules[@]}" "${rules[@]}" "${attacks[@]}" -- "${names[@]}" <<'PY'
import json, sys
out, rounds, nr = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rest = sys.argv[4 + nr:]
rules, attacks, names = sys.argv[4:4 + nr], rest[:rest.index("--")], rest[rest.index("--") + 1:]
run = {(a, r): names[i * len(rules) + j] for i, a in enumerate(attacks) for j, r in enumerate(rules)}
def rows(name):
    try:
        return [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")]
    except OSError:
        return []
def acc(name):
    r = rows(name)
    return 100 * r[-1]["test_accuracy"] if r else float("nan")
def cell(name):  # a run that ended early is marked with the last round it committed
    r = rows(name)
    if len(r) >= rounds:
        return f"{acc(name):.2f}"
    return f"{acc(name):.2f} (failed after round {len(r)})" if r else "failed"
clean = acc("clean")
print(f"Final test accuracy (%) after {rounds} rounds; clean run (mean, no attackers): {clean:.2f}.\n")
print("| attack (2 of 10) | " + " | ".join(rules) + " | best robust rule vs clean (points) |")
print("| --- |" + " --- |" * (len(rules) + 1))
for a in attacks:
    done = {r: acc(run[a, r]) for r in rules if r != "mean" and len(rows(run[a, r])) >= rounds}
    best = max(done, key=done.get) if done else None
    gap = f"{done[best] - clean:+.2f} ({best})" if best else "n/a"
    print(f"| {a} | " + " | ".join(cell(run[a, r]) for r in rules) + f" | {gap} |")
PY
