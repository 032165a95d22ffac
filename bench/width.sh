#!/usr/bin/env bash
# Width-scaled submodels (section width, issue 39), run by `cleave local` as real
# processes: LeNet-5 on Fashion-MNIST split non-IID (Dirichlet 0.5) among 9 clients in
# three tiers of three, whose budgets admit rates 1, 1/4 and 1/16 of the model; ROUNDS
# rounds of one local epoch (momentum SGD, gradients clipped to norm 2: without the clip
# the narrow tiers diverged after 12 to 18 rounds), the same seed and data everywhere.
#
#   heterofl   every client at its tier's rate, HeteroFL's leading submodels
#   fedrolex   the same with FedRolex's rolling window
#   all-1/16   everyone trains the model the smallest tier can hold (width 1/16)
#   top-only   only the top tier trains (the whole model): three clients holding a third
#              of the training set (limit=20000), split among them Dirichlet 0.5
#
# Prints each run's held-out accuracy of the whole model (width 1; all-1/16: its own
# model) by round, and at the end each tier's submodel (cleave evaluate --width). With
# MU > 0 every run uses FedProx (strategy.name fedprox, proximal_mu MU). MODEL=resnet
# runs the ResNet with static batch normalization instead of LeNet-5; LIMIT=N uses the
# first N training images (top-only: N / 3).
#   [MODEL=lenet5] [LIMIT=60000] bench/width.sh [ROUNDS=20] [MU=0]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20}
mu=${2:-0}
strategy="{name: fedavg}"
[ "$mu" = 0 ] || strategy="{name: fedprox, proximal_mu: $mu}"
. bench/common.sh
bench_workdir width
limit=${LIMIT:-60000}
data="fmnist:/usr/share/datasets/fashion-mnist,limit=$limit"
model="{name: lenet5}"
[ "${MODEL:-lenet5}" = lenet5 ] || model="{name: $MODEL, batch_norm: static}"
run() {  # NAME CLIENTS WIDTH-SECTION [DATA]
  local d=${4:-$data}
  cat <<YAML
run: {name: width-bench-$1, rounds: $rounds, seed: 1}
model: $model
data: {test_limit: 5000}
clients: {min: $2, quorum: 1.0, round_deadline_s: 600}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9, clip_norm: 2}
strategy: $strategy
local: {data: "$d", partition: "dirichlet:0.5", clients: $2}
$3
YAML
}
tiers="clients: [{name: client-3, rate: 0.25}, {name: client-4, rate: 0.25}, {name: client-5, rate: 0.25},
                   {name: client-6, rate: 0.0625}, {name: client-7, rate: 0.0625}, {name: client-8, rate: 0.0625}]"
run heterofl 9 "width: {method: heterofl, $tiers}" > "$work/heterofl.yaml"
run fedrolex 9 "width: {method: fedrolex, $tiers}" > "$work/fedrolex.yaml"
run all-1-16 9 "width: {rate: 0.0625}" > "$work/all-1-16.yaml"
run top-only 3 "" "fmnist:/usr/share/datasets/fashion-mnist,limit=$((limit / 3))" > "$work/top-only.yaml"
bench_run heterofl fedrolex all-1-16 top-only
/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
runs = ("heterofl", "fedrolex", "all-1-16", "top-only")
acc = {r: [json.loads(l)["test_accuracy"] for l in open(f"{work}/{r}/metrics.jsonl")] for r in runs}
print("round | " + " | ".join(runs))
for i in range(len(acc["heterofl"])):
    print(f"{i + 1:5d} | " + " | ".join(f"{acc[r][i]:.4f}" if i < len(acc[r]) else "" for r in runs))
PY
bench_widths heterofl 1 0.25 0.0625
bench_widths fedrolex 1 0.25 0.0625
echo "all-1-16 (its own width-1/16 model): $("$bin/cleave" evaluate "$work/all-1-16" --width 0.0625 | tail -1)"
