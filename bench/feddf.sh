#!/usr/bin/env bash
# FedDF on width-scaled submodels (width.distill; Lin et al. 2020; issue 39), run by
# `cleave local` as real processes: the setting of bench/width.sh (LeNet-5, 9 clients in
# tiers of three at rates 1, 1/4 and 1/16, Dirichlet 0.5, one local epoch of momentum SGD
# with gradients clipped to norm 2) on the first 50,000 training images, and a server that
# holds the last 10,000 without their labels. Two runs, the same seed and data:
#
#   heterofl   HeteroFL's per-element mean
#   feddf      the same, then each round the devices' submodels distilled into the whole
#              model on the server's unlabeled images (STEPS Adam steps, T = 1)
#
# Prints each run's held-out accuracy (the test set's first 5,000 images) by round.
#   bench/feddf.sh [ROUNDS=20] [STEPS=200]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20}
steps=${2:-200}
. bench/common.sh
bench_workdir feddf
fmnist="fmnist:/usr/share/datasets/fashion-mnist"
run() {  # NAME DISTILL
  cat <<YAML
run: {name: feddf-bench-$1, rounds: $rounds, seed: 1}
model: {name: lenet5}
data: {test_limit: 5000}
clients: {min: 9, quorum: 1.0, round_deadline_s: 600}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9, clip_norm: 2}
local: {data: "$fmnist,limit=50000", partition: "dirichlet:0.5", clients: 9}
width: {method: heterofl$2,
        clients: [{name: client-3, rate: 0.25}, {name: client-4, rate: 0.25}, {name: client-5, rate: 0.25},
                  {name: client-6, rate: 0.0625}, {name: client-7, rate: 0.0625}, {name: client-8, rate: 0.0625}]}
YAML
}
run heterofl "" > "$work/heterofl.yaml"
run feddf ", distill: {data: \"$fmnist,offset=50000\", steps: $steps}" > "$work/feddf.yaml"
bench_run heterofl feddf
/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
runs = ("heterofl", "feddf")
acc = {r: [json.loads(l)["test_accuracy"] for l in open(f"{work}/{r}/metrics.jsonl")] for r in runs}
print("round | " + " | ".join(runs))
for i in range(len(acc["heterofl"])):
    print(f"{i + 1:5d} | " + " | ".join(f"{acc[r][i]:.4f}" if i < len(acc[r]) else "" for r in runs))
PY
grep -h "FedDF distilled" "$work/feddf/server.log" | tail -1
