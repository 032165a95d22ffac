#!/usr/bin/env bash
# What split learning's privacy options cost in accuracy: sfl-v2 with LeNet-5 cut after
# stage 2, 10 clients, Dirichlet(0.5), one local epoch per round (lr 0.01, momentum 0.9,
# as in the non-IID benchmark: at lr 0.05 the shared server part, stepped by all ten
# clients, diverges), without protection, with Gaussian noise on the activations
# (split.activation_noise) and with NoPeek (split.nopeek). Prints a Markdown table of
# final accuracies.
#   bench/split/privacy.sh [ROUNDS=5]
# One federation at a time; run directories go to runs/bench-split-privacy-ROUNDS/.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-5}
out=runs/bench-split-privacy-$rounds
mkdir -p "$out"
source bench/common.sh
bench_bin  # copies of the binaries: a rebuild meanwhile does not disturb the runs
variants=("none|{}" "noise-0.1|{activation_noise: 0.1}" "noise-0.5|{activation_noise: 0.5}"
          "nopeek-0.1|{nopeek: 0.1}" "nopeek-0.5|{nopeek: 0.5}")
for v in "${variants[@]}"; do
  name=${v%%|*}
  extra=${v#*|}
  dir="$out/$name"
  rm -rf "$dir"
  mkdir -p "$dir"
  opts=${extra#\{}
  opts=${opts%\}}
  cat > "$dir.yaml" <<YAML
run: {name: bench-split-privacy, rounds: $rounds, seed: 42}
model: {name: lenet5}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist"}
clients: {min: 10, fraction: 1.0, quorum: 1.0, round_deadline_s: 600}
train: {local_epochs: 1, batch_size: 32, lr: 0.01, momentum: 0.9}
split: {mode: sfl-v2, cut: 2${opts:+, $opts}}
local: {partition: "dirichlet:0.5", partition_seed: 42, clients: 10}
YAML
  "$bin/cleave" local --config "$dir.yaml" --rounds "$rounds" --run-dir "$dir" > "$dir.log" 2>&1
done
python3 - "$out" "$rounds" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def acc(name):
    return 100 * [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")][-1]["test_accuracy"]
base = acc("none")
print(f"sfl-v2, LeNet-5 cut after stage 2, final test accuracy after {rounds} rounds.\n")
print("| option | test accuracy % | vs none (points) |")
print("| --- | --- | --- |")
for name, label in [("none", "none"), ("noise-0.1", "activation_noise 0.1"),
                    ("noise-0.5", "activation_noise 0.5"), ("nopeek-0.1", "nopeek 0.1"),
                    ("nopeek-0.5", "nopeek 0.5")]:
    a = acc(name)
    print(f"| {label} | {a:.2f} | {a - base:+.2f} |")
PY
