#!/usr/bin/env bash
# Pipelines across devices (split.mode: pipeline, issue 38), run by `cleave local` as
# real processes: a decoder (model gpt: 6 blocks of width 128, context 64, bytes as
# tokens, AdamW) on Debian's fortunes (IID shares), batches of 32 sequences.
#
#   single      one client trains the whole model on all the data (federated, one
#               client): the single-machine run.
#   single-owner    the same on exactly the share of the pipeline's data owner (its
#               partition of three), so that only the batches' order differs.
#   pipeline    one chain of three devices and the server: the devices hold the
#               embedding and the six blocks (split.cut: 7), each a segment the planner
#               sizes within its --memory-limit-mb LIMIT (the whole process's); the
#               server the head; 8 micro-batches (1F1B); float32 on every hop.
#   pipeline-int8   the same with int8:token activations and gradients on every hop.
#   equal-mM    three equal emulated devices (compute slowed 4x, so that the four
#               processes do not contend for this machine's cores), M micro-batches
#               (M = 2, 8), three rounds (the planner re-plans from the compute each
#               device measured): in the last round, the devices' busy share against the
#               analytic bound M / (M + K - 1) of K equal holders.
#   hetero-auto, hetero-even   devices of 1x, 3x and 10x compute on 100, 30 and 10
#               Mbit/s links (a 10x spread of each), two rounds of 10 batches: the
#               planner's plan against the even split of the blocks (split.plan: even).
#   single-limited  the single-machine run under the devices' LIMIT: refused.
#
# The training runs see the same tokens (ROUNDS x STEPS batches of 32 sequences); it
# prints each one's held-out perplexity by round, the planner's line (each device's
# training memory against its limit), the activation bytes per micro-batch on the last
# hop (every hop carries the same shape), the equal devices' busy shares and the
# heterogeneous runs' time per batch.
#   bench/pipeline.sh [ROUNDS=4] [STEPS=25] [LIMIT=200]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-4}
steps=${2:-25}
limit=${3:-200}
work=$(mktemp -d /tmp/cleave-pipeline-XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
bin=$work/bin  # a copy of the binaries: a rebuild meanwhile does not disturb the runs
mkdir -p "$bin"
cp build/bin/cleave build/bin/cleave-server build/bin/cleave-client "$bin"/
text="text:/usr/share/games/fortunes,context=64"
common() {  # NAME ROUNDS
  cat <<YAML
run: {name: pipeline-bench-$1, rounds: $2, seed: 1}
model: {name: gpt, gpt: {vocab: 256, context: 64, layers: 6, heads: 4, dim: 128}}
data: {test: "$text", test_limit: 512}
train: {local_steps: $steps, batch_size: 32, optimizer: adamw, lr: 0.002, weight_decay: 0.01}
YAML
}
{ common single "$rounds"
  echo "clients: {min: 1, quorum: 1.0, round_deadline_s: 1200}"
  echo "local: {data: \"$text\", partition: iid, clients: 1}"; } > "$work/single.yaml"
pipeline() {  # NAME ROUNDS CODEC MICRO SLOWDOWN MEMORY
  common "$1" "$2"
  echo "clients: {min: 3, quorum: 1.0, round_deadline_s: 1200}"
  echo "split: {mode: pipeline, cut: 7, devices: 3, micro_batches: $4, schedule: 1f1b}"
  echo "compression: {activations: $3, gradients: $3}"
  echo "local: {data: \"$text\", partition: iid, clients: 3,"
  echo "        profiles: [{slowdown: $5, memory_limit_mb: $6}]}"
}
pipeline pipeline "$rounds" none 8 1 "$limit" > "$work/pipeline.yaml"
pipeline pipeline-int8 "$rounds" int8:token 8 1 "$limit" > "$work/pipeline-int8.yaml"
pipeline equal-m2 3 none 2 4 0 > "$work/equal-m2.yaml"
pipeline equal-m8 3 none 8 4 0 > "$work/equal-m8.yaml"
hetero() {  # NAME PLAN: devices 1x, 3x and 10x slow with 100, 30 and 10 Mbit/s links
  pipeline "$1" 2 none 8 1 0 | sed -e "s/schedule: 1f1b}/schedule: 1f1b, plan: $2}/" \
    -e 's/profiles: .*/profiles: [{slowdown: 1, uplink_mbps: 100, downlink_mbps: 100},/' \
    -e "s/local_steps: $steps/local_steps: 10/"
  echo "                   {slowdown: 3, uplink_mbps: 30, downlink_mbps: 30},"
  echo "                   {slowdown: 10, uplink_mbps: 10, downlink_mbps: 10}]}"
}
hetero hetero-auto auto > "$work/hetero-auto.yaml"
hetero hetero-even even > "$work/hetero-even.yaml"
# The whole model on one device under the same limit: refused (what it would need).
{ common single-limited 1
  echo "clients: {min: 1, quorum: 1.0, round_deadline_s: 1200}"
  echo "local: {data: \"$text\", partition: iid, clients: 1, profiles: [{memory_limit_mb: $limit}]}"; } \
  > "$work/single-limited.yaml"
# (The server then waits for a client that can hold the model: stopped after 60 s.)
timeout 60 "$bin/cleave" local --insecure --config "$work/single-limited.yaml" --run-dir "$work/single-limited" \
  > "$work/single-limited.out" 2>&1 || true
echo "single-limited: $(grep -h -o 'cannot hold the model: .*' "$work/single-limited/server.log" | head -1)"
for run in single pipeline pipeline-int8 equal-m2 equal-m8 hetero-auto hetero-even; do
  start=$(date +%s)
  "$bin/cleave" local --insecure --config "$work/$run.yaml" --run-dir "$work/$run" > "$work/$run.out" 2>&1 ||
    { tail -30 "$work/$run.out"; exit 1; }
  echo "$run: $(( $(date +%s) - start )) s"
done
# The controlled single-machine run: one process trains the whole model on exactly the
# pipeline's data owner's share (the same sequences), by hand: a server and one client.
owner=$(/usr/bin/python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['pipeline'][0]['devices'][0])" \
  "$work/pipeline/metrics.jsonl")
{ common single-owner "$rounds"; echo "clients: {min: 1, quorum: 1.0, round_deadline_s: 1200}"; } > "$work/single-owner.yaml"
mkdir -p "$work/single-owner"
start=$(date +%s)
"$bin/cleave-server" --config "$work/single-owner.yaml" --run-dir "$work/single-owner" --listen 127.0.0.1:0 \
  --insecure > "$work/single-owner/server.out" 2>&1 &
server=$!
while [ ! -s "$work/single-owner/server.addr" ]; do sleep 0.2; done
"$bin/cleave-client" --server "$(cat "$work/single-owner/server.addr")" --data "$text" \
  --partition "iid,client=${owner#client-},of=3,seed=42" --name "$owner" --insecure > "$work/single-owner/client.out" 2>&1
wait "$server"
echo "single-owner ($owner's share): $(( $(date +%s) - start )) s"
for run in pipeline equal-m2 equal-m8 hetero-auto hetero-even; do
  echo "$run, the planner's last plan: $(grep -h -o 'chain of [0-9]* planned.*' "$work/$run/server.log" | tail -1)"
done
/usr/bin/python3 - "$work" "$steps" <<'PY'
import json, math, sys
work, steps = sys.argv[1], int(sys.argv[2])
def rows(run):
    return [r for r in (json.loads(l) for l in open(f"{work}/{run}/metrics.jsonl")) if not r.get("evaluation_only")]
runs = {n: rows(n) for n in ("single", "single-owner", "pipeline", "pipeline-int8")}
print("\nheld-out perplexity by round (equal tokens: rounds x %d batches of 32 sequences)" % steps)
print("round | " + " | ".join(runs))
for i in range(len(runs["single"])):
    print(f"{i + 1:5d} | " + " | ".join(f"{math.exp(runs[n][i]['test_loss']):.3f}" for n in runs))
p = math.exp(runs["pipeline"][-1]["test_loss"])
for n in ("single", "single-owner"):
    print(f"pipeline / {n} at the end: {p / math.exp(runs[n][-1]['test_loss']):.4f}")
for n in ("pipeline", "pipeline-int8"):
    r = runs[n][-1]
    micro = steps * 8  # micro-batches a round, one chain
    print(f"{n}: last hop {r['activation_bytes_up'] / micro:.0f} B activations (and labels) up, "
          f"{r['gradient_bytes_down'] / micro:.0f} B gradients down per micro-batch of 4 sequences")
print("\nequal devices (the last of three rounds, compute slowed 4x):")
for n, m in (("equal-m2", 2), ("equal-m8", 8)):
    c = rows(n)[-1]["pipeline"][0]
    k = len(c["devices"])
    bound = m / (m + k - 1)
    busy = sum(c["busy"]) / k
    print(f"  M={m}: {k} devices, bounds {c['bounds']}, busy {', '.join(f'{b:.3f}' for b in c['busy'])}; "
          f"mean {busy:.3f} against the bound M/(M+K-1) = {bound:.3f}: {busy / bound:.3f}x")
print("\nheterogeneous devices (1x, 3x, 10x compute; 100, 30, 10 Mbit/s), the second of two rounds of 10 batches:")
wall = {}
for n in ("hetero-auto", "hetero-even"):
    r = rows(n)[-1]
    c = r["pipeline"][0]
    wall[n] = r["wall_s"] / 10
    print(f"  {n}: devices {c['devices']}, bounds {c['bounds']}, busy {', '.join(f'{b:.2f}' for b in c['busy'])}, "
          f"{wall[n]:.2f} s a batch (the round's wall time / 10)")
print(f"  the planner's plan against the even split: {wall['hetero-even'] / wall['hetero-auto']:.2f}x faster")
PY
