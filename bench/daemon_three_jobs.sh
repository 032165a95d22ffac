#!/usr/bin/env bash
# Issue 58's first target: three jobs of different kinds submitted at once to one daemon
# with ten long-lived clients (--scheduler fair), each against the same job run alone
# (cleave-server --config with ten fresh clients):
#   fedavg  MLP on Fashion-MNIST, 20 rounds
#   sflv2   LeNet-5 split at layer 1 (SFL-v2) on Fashion-MNIST, 10 rounds
#   lora    a 4-layer decoder (model gpt) with rank-4 LoRA adapters on the fortunes text
#           (the clients' dataset `fortunes`), 10 rounds
# Each job trains 3 clients a round (clients.per_round: 3), alone or sharing the pool, so
# the two runs differ only in which clients train and when. Prints each job's accuracy
# (the image jobs) or perplexity (lora), the mean of its last five rounds, alone and on
# the daemon, and checks that no client process restarted.
#   bench/daemon_three_jobs.sh        (from the checkout's root, after make build)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
bench_workdir daemon-three-jobs
FMNIST=/usr/share/datasets/fashion-mnist
TEXT="text:/usr/share/games/fortunes,context=64"
CLIENTS=10
JOBS="fedavg sflv2 lora"

job() {  # NAME ROUNDS YAML
  cat > "$work/$1.yaml" <<YAML
run: {name: $1, rounds: $2, seed: 7}
clients: {min: 3, per_round: 3, quorum: 1.0, round_deadline_s: 300}
$3
YAML
}
job fedavg 20 "model: {name: mlp}
data: {test: \"fmnist:$FMNIST\", test_limit: 2000}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}"
job sflv2 10 "model: {name: lenet5}
data: {test: \"fmnist:$FMNIST\", test_limit: 2000}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
split: {mode: sfl-v2, cut: 1}"
job lora 10 "model: {name: gpt, gpt: {vocab: 256, context: 64, layers: 4, heads: 4, dim: 128}, lora: {rank: 4, alpha: 8}}
data: {test: \"$TEXT\", test_limit: 256, dataset: fortunes}
train: {local_steps: 30, batch_size: 16, optimizer: adamw, lr: 0.005, weight_decay: 0.01, clip_norm: 1.0}"
bench_daemon_auth
port=$(( 20000 + RANDOM % 20000 ))

cpids=()
clients() {  # LOGPREFIX ARGS...: ten clients, their pids in cpids
  local i
  cpids=()
  for i in $(seq 0 $(( CLIENTS - 1 ))); do
    "$bin/cleave-client" --server 127.0.0.1:$port --insecure "${@:2}" --name "c$i" \
      --partition "iid,client=$i,of=$CLIENTS,seed=1" > "$work/$1-client$i.log" 2>&1 &
    cpids+=($!)
  done
}
data_of() { [ "$1" = lora ] && echo "$TEXT" || echo "fmnist:$FMNIST,limit=18000"; }

# Alone: each job on its own server, with ten fresh clients.
for j in $JOBS; do
  clients "alone-$j" --data "$(data_of $j)"
  "$bin/cleave-server" --config "$work/$j.yaml" --listen 127.0.0.1:$port --run-dir "$work/alone-$j" \
    --insecure > "$work/alone-$j.log" 2>&1
  wait "${cpids[@]}" || true
done

# Together: one daemon, its ten clients exposing both datasets, the jobs submitted at once.
"$bin/cleave-server" --daemon --state-dir "$work/state" --listen 127.0.0.1:0 --clients-listen 127.0.0.1:$port \
  --policy "$work/policy.yaml" --insecure --scheduler fair > "$work/daemon.log" 2>&1 &
daemon=$!
clients daemon --stay --data "fmnist:$FMNIST,limit=18000" --dataset "fortunes=$TEXT"
trap 'kill $daemon "${cpids[@]}" 2> /dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
for i in $(seq 100); do [ -s "$work/state/daemon.addr" ] && break; sleep 0.1; done
for i in $(seq 0 $(( CLIENTS - 1 ))); do
  until grep -q "attached to the pool" "$work/daemon-client$i.log"; do sleep 0.2; done
done
api=$(cat "$work/state/daemon.addr")
cj() { "$bin/cleave" job --server "$api" --insecure --token-file "$work/token" "$@"; }
declare -A id
for j in $JOBS; do id[$j]=$(cj submit "$work/$j.yaml"); done
field() { sed -n "s/^  $1 *\(.*\)\$/\1/p" <<< "$2"; }
for j in $JOBS; do
  until s=$(cj status "${id[$j]}") && grep -qE "state +(succeeded|failed|cancelled)" <<< "$s"; do sleep 0.5; done
  [ "$(field state "$s")" = succeeded ] || { echo "$j:"; echo "$s"; exit 1; }
done
for p in "${cpids[@]}"; do kill -0 "$p" || { echo "a client process ended"; exit 1; }; done

# The mean of a metric over a run's last five rounds (single rounds move by a point).
last5() { grep -o "\"$2\":[0-9.]*" "$1/metrics.jsonl" | cut -d: -f2 | tail -5 | awk '{s += $1} END {print s / NR}'; }
for j in $JOBS; do
  if [ $j = lora ]; then
    awk -v j=$j -v a="$(last5 "$work/alone-$j" test_perplexity)" -v t="$(last5 "$work/state/jobs/${id[$j]}" test_perplexity)" \
      'BEGIN { printf "%-7s perplexity (last 5 rounds) alone %.3f, on the daemon %.3f (%+.2f %%)\n", j, a, t, 100 * (t - a) / a }'
  else
    awk -v j=$j -v a="$(last5 "$work/alone-$j" test_accuracy)" -v t="$(last5 "$work/state/jobs/${id[$j]}" test_accuracy)" \
      'BEGIN { printf "%-7s accuracy (last 5 rounds) alone %.4f, on the daemon %.4f (%+.2f points)\n", j, a, t, (t - a) * 100 }'
  fi
done
echo "no client process restarted: the same $CLIENTS served all three jobs"
