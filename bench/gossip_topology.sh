#!/usr/bin/env bash
# Gossip topologies on devices with a 10x uplink spread (issue 17, DySTop's topology
# control): the non-IID Fashion-MNIST federation of bench/gossip.sh (10 clients,
# Dirichlet 0.5, LeNet-5, 10 % held out), two clients' uplinks emulated at 1 Mbit/s and
# the other eight's at 10 Mbit/s, run by `cleave local` with three graphs:
#   ring:      2 neighbours each;
#   random:    2 random rings drawn each round (up to 4 neighbours), whoever is slow;
#   measured:  the ring plus the edges the measured uplinks afford within the slow
#              clients' two ring sends (scheduler.topology: measured, degree 4).
# For each it prints the mean time of rounds 2.., the neighbours per client, the model bytes
# moved, and the clients' mean held-out accuracy after each 5 rounds.
#   bench/gossip_topology.sh [ROUNDS]   # default 15
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-15}
bin=build/bin
work=$(mktemp -d /tmp/cleave-topology-XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
for topology in ring random measured; do
  cat > "$work/$topology.yaml" <<YAML
run: {name: topology-bench-$topology, rounds: $rounds, seed: 42}
model: {name: lenet5}
data: {test: ""}
server: {evaluate: false, final_evaluation: false}
clients: {min: 10, quorum: 1.0, round_deadline_s: 600}
scheduler: {mode: gossip, topology: $topology, degree: 4}
train: {local_epochs: 1, batch_size: 32, lr: 0.02, momentum: 0.9}
local:
  data: "fmnist:/usr/share/datasets/fashion-mnist"
  partition: "dirichlet:0.5"
  partition_seed: 42
  clients: 10
  holdout: 0.1
  profiles: [{uplink_mbps: 1}, {uplink_mbps: 10}, {uplink_mbps: 10}, {uplink_mbps: 10},
             {uplink_mbps: 10}]
YAML
  start=$(date +%s)
  "$bin/cleave" local --insecure --config "$work/$topology.yaml" --run-dir "$work/$topology" \
    > "$work/$topology.out"
  echo "$topology: $(( $(date +%s) - start )) s"
done
/usr/bin/python3 - "$work" "$rounds" <<'PY'
import json, sys
work, rounds = sys.argv[1], int(sys.argv[2])
print("topology | mean round s | neighbours / client | model MB moved | acc " +
      " | ".join(f"r{r}" for r in range(5, rounds + 1, 5)))
for run in ("ring", "random", "measured"):
    rows = [json.loads(l) for l in open(f"{work}/{run}/metrics.jsonl")]
    rows = [r for r in rows if not r.get("evaluation_only")]
    # elapsed_s is since the run began: rounds 2.. (round 1 fetches the initial model
    # and, for measured, is still the ring).
    secs = (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]) / (len(rows) - 1)
    nbrs = sum(r["gossip"]["neighbours"] for r in rows) / len(rows) / 10
    moved = sum(r["gossip"]["peer_bytes"] for r in rows) / 1e6
    accs = [r["client_eval"]["accuracy"] for r in rows]
    print(f"{run} | {secs:.2f} | {nbrs:.2f} | {moved:.1f} | " +
          " | ".join(f"{accs[r - 1]:.4f}" for r in range(5, rounds + 1, 5)))
PY
