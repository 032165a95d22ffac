#!/usr/bin/env bash
# One daemon, four Fashion-MNIST jobs arriving GAP s apart (default 2), six long-lived clients of
# unequal speed (compute slowdowns 1, 1, 2, 2, 3, 3), run once under each scheduler
# (--scheduler fifo, fair, then goodput; SCHEDULERS to choose): each job's completion time
# (submitted to ended) and final accuracy, and the mean completion time of each scheduler. A job ends at a test
# accuracy of TARGET (default 0.86; run.target_accuracy) or after ROUNDS rounds (default
# 80), so completion is time to that accuracy where it is reached. The daemon's resident
# memory is read with its clients attached before the first job, and after the last ended.
# Each job's forecast end (cleave job status) is read once 20 % of the rounds it ran were
# committed and compared with when it ended.
#   bench/daemon_schedulers.sh        (from the checkout's root, after make build)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
bench_workdir daemon-schedulers
FMNIST=/usr/share/datasets/fashion-mnist
JOBS="j1 j2 j3 j4"
for j in $JOBS; do
  cat > "$work/$j.yaml" <<YAML
run: {name: $j, rounds: ${ROUNDS:-80}, seed: 7, target_accuracy: ${TARGET:-0.86}}
model: {name: mlp}
data: {test: "fmnist:$FMNIST", test_limit: 2000}
clients: {min: 2, quorum: 1.0, round_deadline_s: 300}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
YAML
done
bench_daemon_auth

ms() { date -u -d "${1% *} ${2%Z}" +%s%3N; }  # "YYYY-MM-DD HH:MM:SS.mmmZ" -> Unix ms
field() { sed -n "s/^  $1 *\(.*\)\$/\1/p" <<< "$2"; }
last() { grep -o '"test_accuracy":[0-9.]*' "$1/metrics.jsonl" | cut -d: -f2 | tail -1; }

pids=()
trap 'kill "${pids[@]}" 2> /dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
SCHEDULERS=${SCHEDULERS:-fifo fair goodput}
for sched in $SCHEDULERS; do
  port=$(( 20000 + RANDOM % 20000 ))
  state=$work/$sched
  "$bin/cleave-server" --daemon --state-dir "$state" --listen 127.0.0.1:0 --clients-listen 127.0.0.1:$port \
    --policy "$work/policy.yaml" --insecure --scheduler $sched > "$work/$sched-daemon.log" 2>&1 &
  pids=($!)
  for i in $(seq 100); do [ -s "$state/daemon.addr" ] && break; sleep 0.1; done
  for i in 0 1 2 3 4 5; do
    "$bin/cleave-client" --server 127.0.0.1:$port --insecure --stay --name "c$i" \
      --data "fmnist:$FMNIST,limit=18000" --partition "iid,client=$i,of=6,seed=1" \
      --emulate-slowdown $(( i / 2 + 1 )) > "$work/$sched-client$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2 3 4 5; do
    until grep -q "attached to the pool" "$work/$sched-client$i.log"; do sleep 0.2; done
  done
  rss() { awk '/^VmRSS/ { printf "%.0f MiB", $2 / 1024 }' "/proc/${pids[0]}/status"; }
  idle=$(rss)
  api=$(cat "$state/daemon.addr")
  cj() { "$bin/cleave" job --server "$api" --insecure --token-file "$work/token" "$@"; }
  declare -A id=()
  for j in $JOBS; do
    id[$j]=$(cj submit "$work/$j.yaml")
    [ $j = j4 ] || sleep "${GAP:-2}"
  done
  # Every job polled until all ended; each poll of a running job records its forecast:
  # "JOB COMMITTED_ROUNDS FORECAST_MS READ_MS".
  declare -A final=()
  : > "$work/$sched.forecasts"
  left=4
  while [ $left -gt 0 ]; do
    left=0
    for j in $JOBS; do
      [ -z "${final[$j]:-}" ] || continue
      s=$(cj status "${id[$j]}")
      if grep -qE "state +(succeeded|failed|cancelled)" <<< "$s"; then final[$j]=$s; continue; fi
      left=$(( left + 1 ))
      ends=$(field ends "$s" | sed 's/ (forecast)//')
      [ "$ends" = - ] || echo "$j $(field progress "$s" | cut -d/ -f1) $(ms $ends) $(date +%s%3N)" >> "$work/$sched.forecasts"
    done
    sleep 1
  done
  for j in $JOBS; do
    s=${final[$j]}
    [ "$(field state "$s")" = succeeded ] || { echo "$sched $j:"; echo "$s"; exit 1; }
    jct=$(( $(ms $(field ended "$s")) - $(ms $(field submitted "$s")) ))
    rounds=$(field progress "$s" | cut -d/ -f1 | cut -d' ' -f1)
    # The first forecast made once 20 % of the rounds it ran were committed.
    fc=$(awk -v j=$j -v r="$rounds" '$1 == j && $2 * 5 >= r { print $3, $4; exit }' "$work/$sched.forecasts")
    echo "$sched $j $jct $(last "$state/jobs/${id[$j]}") $rounds ${fc:-0 0} $(ms $(field ended "$s")) $(ms $(field started "$s"))"
  done | tee "$work/$sched.txt"
  echo "$sched: the daemon's resident memory $idle before the first job, $(rss) after the last ended"
  kill "${pids[@]}" 2> /dev/null || true
  wait 2> /dev/null || true
done
# Each job: completion, final accuracy, rounds, and the forecast made at 20 % of its rounds
# against its end, as a share of the time left when it was made and of the job's run.
for sched in $SCHEDULERS; do
  awk -v s=$sched '{ printf "%s %s: completion %.1f s, final accuracy %.4f, %d rounds", s, $2, $3 / 1000, $4, $5
      if ($6 == 0) printf ", no forecast seen\n"
      else printf ", forecast at 20 %%: %+.1f %% of the time left, %+.1f %% of its run\n",
        100 * ($6 - $8) / ($8 - $7), 100 * ($6 - $8) / ($8 - $9)
      t += $3 }
    END { printf "%s: mean completion %.1f s\n", s, t / NR / 1000 }' "$work/$sched.txt"
  awk '{ t += $3 } END { print t / NR }' "$work/$sched.txt" > "$work/$sched.mean"
done
for a in $SCHEDULERS; do
  for b in $SCHEDULERS; do
    [[ $a < $b ]] || continue
    awk -v a="$(cat "$work/$a.mean")" -v b="$(cat "$work/$b.mean")" -v n="$a / $b" \
      'BEGIN { printf "%s mean completion: %.2f\n", n, a / b }'
  done
done
