#!/usr/bin/env bash
# One daemon, three jobs submitted at once, three clients that stay (unequal: compute
# slowdowns 1, 2 and 3): each job's accuracy against the same job run alone
# (cleave-server --config with three fresh clients), and each job's forecast end, read
# once 20 % of its rounds are committed, against when it ended.
#   bench/daemon_jobs.sh        (from the checkout's root, after make build)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
bench_workdir daemon-jobs
FMNIST=/usr/share/datasets/fashion-mnist

job() {  # NAME ROUNDS EXTRA_YAML
  cat > "$work/$1.yaml" <<YAML
run: {name: $1, rounds: $2, seed: 7}
model: {name: $3}
data: {test: "fmnist:$FMNIST", test_limit: 2000}
clients: {min: 3, quorum: 1.0, round_deadline_s: 300}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
$4
YAML
}
job fedavg 20 mlp ""
job fedprox 10 mlp "strategy: {name: fedprox, proximal_mu: 0.01}"
job sflv2 10 lenet5 "split: {mode: sfl-v2, cut: 1}"

bench_daemon_auth
port=$(( 20000 + RANDOM % 20000 ))

cpids=()
clients() {  # LOGPREFIX [--stay]: three clients, their pids in cpids
  local i
  cpids=()
  for i in 0 1 2; do
    "$bin/cleave-client" --server 127.0.0.1:$port --insecure "${@:2}" --name "c$i" \
      --data "fmnist:$FMNIST,limit=18000" --partition "iid,client=$i,of=3,seed=1" \
      --emulate-slowdown $(( i + 1 )) > "$work/$1-client$i.log" 2>&1 &
    cpids+=($!)
  done
}

# Alone: each job on its own server, with fresh clients.
for j in fedavg fedprox sflv2; do
  clients "alone-$j"
  "$bin/cleave-server" --config "$work/$j.yaml" --listen 127.0.0.1:$port --run-dir "$work/alone-$j" \
    --insecure > "$work/alone-$j.log" 2>&1
  wait "${cpids[@]}" || true
done

# Together: one daemon, submitted at once.
"$bin/cleave-server" --daemon --state-dir "$work/state" --listen 127.0.0.1:0 --clients-listen 127.0.0.1:$port \
  --policy "$work/policy.yaml" --insecure > "$work/daemon.log" 2>&1 &
daemon=$!
clients daemon --stay
trap 'kill $daemon "${cpids[@]}" 2> /dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
for i in $(seq 100); do [ -s "$work/state/daemon.addr" ] && break; sleep 0.1; done
for i in 0 1 2; do  # a job no attached client would take is refused at submission
  until grep -q "attached to the pool" "$work/daemon-client$i.log"; do sleep 0.2; done
done
api=$(cat "$work/state/daemon.addr")
cj() { "$bin/cleave" job --server "$api" --insecure --token-file "$work/token" "$@"; }
declare -A id
for j in fedavg fedprox sflv2; do id[$j]=$(cj submit "$work/$j.yaml"); done

ms() { date -u -d "${1% *} ${2%Z}" +%s%3N; }  # "YYYY-MM-DD HH:MM:SS.mmmZ" -> Unix ms
field() { sed -n "s/^  $1 *\(.*\)\$/\1/p" <<< "$2"; }
# Every job polled together until all have ended; each forecast read once 20 % of its
# rounds are committed.
declare -A forecast at status
left=3
while [ $left -gt 0 ]; do
  left=0
  for j in fedavg fedprox sflv2; do
    s=$(cj status "${id[$j]}")
    status[$j]=$s
    state=$(field state "$s")
    case "$state" in succeeded*|failed*|cancelled*) continue ;; esac
    left=$(( left + 1 ))
    rounds=$(grep -o 'rounds: [0-9]*' "$work/$j.yaml" | grep -o '[0-9]*')
    done_rounds=$(field progress "$s" | cut -d/ -f1)
    if [ -z "${forecast[$j]:-}" ] && [ "$done_rounds" -ge $(( rounds / 5 )) ]; then
      forecast[$j]=$(ms $(field ends "$s" | sed 's/ (forecast)//'))
      at[$j]=$(date +%s%3N)
    fi
  done
  sleep 0.2
done

# The mean test accuracy of a run's last five rounds (single rounds move by a point).
last5() { grep -o '"test_accuracy":[0-9.]*' "$1/metrics.jsonl" | cut -d: -f2 | tail -5 | awk '{s += $1} END {print s / NR}'; }
for j in fedavg fedprox sflv2; do
  s=${status[$j]}
  [ "$(field state "$s")" = succeeded ] || { echo "$j:"; echo "$s"; exit 1; }
  awk -v j="$j" -v a="$(last5 "$work/alone-$j")" -v t="$(last5 "$work/state/jobs/${id[$j]}")" \
      -v f="${forecast[$j]:-0}" -v at="${at[$j]:-0}" -v e="$(ms $(field ended "$s"))" \
      -v s="$(ms $(field started "$s"))" 'BEGIN {
    printf "%-8s accuracy (last 5 rounds) alone %.4f, on the daemon %.4f (%+.2f points); ", j, a, t, (t - a) * 100
    if (f == 0) { print "no forecast seen"; exit }
    printf "forecast at 20 %%: off by %+.1f s = %+.1f %% of the time left then, %+.1f %% of its run\n",
      (f - e) / 1000, 100 * (f - e) / (e - at), 100 * (f - e) / (e - s) }'
done
