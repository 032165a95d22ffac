#!/usr/bin/env bash
# Decentralised rounds (scheduler.mode: gossip) against FedAvg at equal bytes (issue
# 17): one non-IID Fashion-MNIST federation (10 clients, Dirichlet 0.5 label skew,
# LeNet-5, one local epoch, 10 % of each client's data held out), run by `cleave local`
# three times:
#   fedavg:  every client every round, the server averages;
#   ring:    gossip on a ring: each client sends its model to 2 neighbours and gets
#            theirs, 2n model transfers a round, as FedAvg's n down and n up;
#   random:  gossip on 2 random rings drawn anew each round (up to 4 neighbours):
#            up to 4n model transfers a round.
# For each round it prints the model bytes moved so far and the clients' mean held-out
# accuracy of the model each holds as the round begins (FedAvg: the global model;
# gossip: each client's own), and for gossip the neighbours' disagreement (mean squared
# distance between neighbouring models after local training). Then the accuracy each
# reaches within the bytes FedAvg's rounds took.
#   bench/gossip.sh [ROUNDS]   # default 20
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20}
bin=build/bin
work=$(mktemp -d /tmp/cleave-gossip-XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
common() {
  cat <<YAML
run: {name: gossip-bench-$1, rounds: $rounds, seed: 42}
model: {name: lenet5}
data: {test: ""}
server: {evaluate: false, final_evaluation: false}
clients: {min: 10, quorum: 1.0, round_deadline_s: 600}
train: {local_epochs: 1, batch_size: 32, lr: 0.02, momentum: 0.9}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist", partition: "dirichlet:0.5",
        partition_seed: 42, clients: 10, holdout: 0.1}
YAML
}
common fedavg > "$work/fedavg.yaml"
{ common ring; echo "scheduler: {mode: gossip, topology: ring}"; } > "$work/ring.yaml"
{ common random; echo "scheduler: {mode: gossip, topology: random, degree: 4}"; } > "$work/random.yaml"
for run in fedavg ring random; do
  start=$(date +%s)
  "$bin/cleave" local --insecure --config "$work/$run.yaml" --run-dir "$work/$run" > "$work/$run.out"
  echo "$run: $(( $(date +%s) - start )) s"
done
/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
model_bytes = None
runs = {}
for run in ("fedavg", "ring", "random"):
    rows = [json.loads(l) for l in open(f"{work}/{run}/metrics.jsonl")]
    rows = [r for r in rows if not r.get("evaluation_only")]
    if run == "fedavg":
        # The model's encoded size: the fp32 bytes of one round's uploads over its clients.
        model_bytes = rows[0]["update_bytes"] / rows[0]["participants"]
    moved, out = 0, []
    for r in rows:
        if run == "fedavg":
            moved += 2 * r["participants"] * model_bytes  # the model down, the update up
        else:
            moved += r["gossip"]["peer_bytes"]  # each model sent once, received once
        out.append((r["round"], moved, r["client_eval"]["accuracy"],
                    r.get("gossip", {}).get("disagreement")))
    runs[run] = out
print(f"model: {model_bytes / 1e6:.2f} MB")
print("round | " + " | ".join(f"{n} MB, acc" + (", disagreement" if n != "fedavg" else "")
                             for n in runs))
for i in range(len(runs["fedavg"])):
    cells = []
    for n, out in runs.items():
        rnd, moved, acc, dis = out[i]
        cells.append(f"{moved / 1e6:8.1f} {acc:.4f}" + (f" {dis:.4g}" if dis is not None else ""))
    print(f"{i + 1:5d} | " + " | ".join(cells))
budget = runs["fedavg"][-1][1]
print(f"\nwithin FedAvg's {budget / 1e6:.0f} MB:")
for n, out in runs.items():
    within = [o for o in out if o[1] <= budget * 1.0001]
    best = within[-1] if within else None
    print(f"  {n}: round {best[0]}, accuracy {best[2]:.4f}" if best else f"  {n}: none")
PY
