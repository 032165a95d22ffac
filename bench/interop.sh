#!/usr/bin/env bash
# Interoperable architectures (model.name interop; Krouka & Bennis; issue 39), run by
# `cleave local` as real processes: Fashion-MNIST (the first LIMIT training images) split
# non-IID (Dirichlet 0.5) among 9 clients, each holding out 10 % for federated
# evaluation; ROUNDS rounds of one local epoch (Adam, lr 0.002), the same seed and data
# everywhere.
#
#   interop    three private bases (3 clients each: mlp, lenet5, cnn), each with a fusion
#              layer to width 64, sharing a block of 64 -> 64 -> 10: only the block travels
#   interop-cnn  the same with every base a cnn (homogeneous bases, still private)
#   fedavg-cnn   a homogeneous federation of the best base: plain FedAvg of the whole cnn
#
# With MU > 0 every run uses FedProx (strategy.name fedprox, proximal_mu MU) instead of
# FedAvg's plain mean.
#
# Prints each run's clients' held-out accuracy (their weighted mean, min and max) by round
# and at the end, and the bytes each uploaded per round.
#   bench/interop.sh [ROUNDS=15] [LIMIT=18000] [MU=0]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-15}
limit=${2:-18000}
mu=${3:-0}
strategy="{name: fedavg}"
[ "$mu" = 0 ] || strategy="{name: fedprox, proximal_mu: $mu}"
. bench/common.sh
bench_workdir interop
data="fmnist:/usr/share/datasets/fashion-mnist,limit=$limit"
run() {  # NAME MODEL-SECTION
  cat <<YAML
run: {name: interop-bench-$1, rounds: $rounds, seed: 1}
model: $2
data: {test: ""}
clients: {min: 9, quorum: 1.0, round_deadline_s: 600}
train: {local_epochs: 1, batch_size: 32, optimizer: adam, lr: 0.002}
strategy: $strategy
local: {data: "$data", partition: "dirichlet:0.5", clients: 9, holdout: 0.1}
YAML
}
bases="clients: [{name: client-3, base: lenet5}, {name: client-4, base: lenet5}, {name: client-5, base: lenet5},
                 {name: client-6, base: cnn}, {name: client-7, base: cnn}, {name: client-8, base: cnn}]"
run interop "{name: interop, interop: {base: mlp, width: 64, $bases}}" > "$work/interop.yaml"
run interop-cnn "{name: interop, interop: {base: cnn, width: 64}}" > "$work/interop-cnn.yaml"
run fedavg-cnn "{name: cnn}" > "$work/fedavg-cnn.yaml"
runs="interop interop-cnn fedavg-cnn"
bench_run $runs
/usr/bin/python3 - "$work" $runs <<'PY'
import json, sys
work, runs = sys.argv[1], sys.argv[2:]
rows = {r: [json.loads(l) for l in open(f"{work}/{r}/metrics.jsonl")] for r in runs}
def acc(row):
    e = row.get("client_eval", {})
    return f"{e.get('accuracy', float('nan')):.4f}" if e else ""
print("row | " + " | ".join(runs))
for i in range(max(len(v) for v in rows.values())):
    label = "final" if any(i < len(rows[r]) and rows[r][i].get("evaluation_only") for r in runs) else f"{i + 1}"
    print(f"{label:>5} | " + " | ".join(acc(rows[r][i]) if i < len(rows[r]) else "" for r in runs))
for r in runs:
    e = rows[r][-1]["client_eval"]
    up = [x["bytes_up"] for x in rows[r] if not x.get("evaluation_only")]
    print(f"{r}: final clients' accuracy {e['accuracy']:.4f} (min {e['accuracy_min']:.4f}, max {e['accuracy_max']:.4f}), "
          f"{sum(up) / len(up) / 1e3:.1f} kB up per round")
PY
