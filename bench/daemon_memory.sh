#!/usr/bin/env bash
# What a finished job leaves in the daemon: twelve Fashion-MNIST jobs (MLP, 2 rounds),
# run one after another by one daemon over the same two long-lived clients, and the
# daemon's resident memory after each ended (and with its clients attached before the
# first). A job's coordinator is freed when it ends; what stays should stop growing.
#   bench/daemon_memory.sh        (from the checkout's root, after make build)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
bench_workdir daemon-memory
FMNIST=/usr/share/datasets/fashion-mnist
JOBS=${JOBS:-12}
bench_daemon_auth
port=$(( 20000 + RANDOM % 20000 ))
"$bin/cleave-server" --daemon --state-dir "$work/state" --listen 127.0.0.1:0 --clients-listen 127.0.0.1:$port \
  --policy "$work/policy.yaml" --insecure > "$work/daemon.log" 2>&1 &
pids=($!)
trap 'kill "${pids[@]}" 2> /dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
for i in $(seq 100); do [ -s "$work/state/daemon.addr" ] && break; sleep 0.1; done
for i in 0 1; do
  "$bin/cleave-client" --server 127.0.0.1:$port --insecure --stay --name "c$i" \
    --data "fmnist:$FMNIST,limit=4000" --partition "iid,client=$i,of=2,seed=1" > "$work/client$i.log" 2>&1 &
  pids+=($!)
done
for i in 0 1; do until grep -q "attached to the pool" "$work/client$i.log"; do sleep 0.2; done; done
rss() { awk '/^VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/${pids[0]}/status"; }
echo "attached, no job: $(rss) MiB"
api=$(cat "$work/state/daemon.addr")
cj() { "$bin/cleave" job --server "$api" --insecure --token-file "$work/token" "$@"; }
for n in $(seq "$JOBS"); do
  cat > "$work/job.yaml" <<YAML
run: {name: job$n, rounds: 2, seed: $n}
model: {name: mlp}
data: {test: "fmnist:$FMNIST", test_limit: 1000}
clients: {min: 2, quorum: 1.0}
train: {local_epochs: 1, batch_size: 32, lr: 0.05}
YAML
  id=$(cj submit "$work/job.yaml")
  until cj status "$id" | grep -qE "state +(succeeded|failed|cancelled)"; do sleep 0.2; done
  cj status "$id" | grep -qE "state +succeeded" || { cj status "$id"; exit 1; }
  echo "after $n job(s) ended: $(rss) MiB"
done
