#!/usr/bin/env bash
# A malicious server and the device's guard (issue 41, item 4), on LeNet-5 and
# Fashion-MNIST, two devices of 2000 images each, sfl-v2, batches of 32 (62 micro-batches
# per device and round), the same seeds throughout:
#   1. the red-team server (split.hijack: fsha) hijacks unguarded devices at cuts 1, 2
#      and 3 for 6 rounds; `cleave attack hijack` scores what its decoder reads of the
#      first 4 micro-batches of every task, round by round, against the devices' inputs;
#   2. the same with every device's SplitGuard on (local.split_guard): when it refuses
#      the server, after how many fakes, and what the server read of every micro-batch
#      it received before that (all recorded);
#   3. an honest server with and without the guard, at every cut, sl and sfl-v2, 6
#      rounds: whether the guard refuses (it must not), its mean score, and the test
#      accuracy it costs (the fakes' moved labels train the server's part).
# Prints three Markdown tables (PARTS="3" for the third alone; TRAIN="optimizer: adam,
# lr: 0.001" for another optimizer than plain SGD at lr 0.05, into runs/bench-hijack-TAG
# with TAG set).
#   bench/privacy/hijack.sh
# Run directories go to runs/bench-hijack/.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=runs/bench-hijack${TAG:+-$TAG}
train=${TRAIN:-lr: 0.05}
mkdir -p "$out"
source bench/common.sh
bench_bin  # copies of the binaries: a rebuild meanwhile does not disturb the runs
fmnist=/usr/share/datasets/fashion-mnist

# job NAME ROUNDS SPLIT LOCAL_EXTRA: writes $out/NAME.yaml.
job() {
  cat > "$out/$1.yaml" <<YAML
run: {name: bench-hijack, rounds: $2, seed: 1}
model: {name: lenet5}
data: {test: "fmnist:$fmnist", test_limit: 2000}
clients: {min: 2, quorum: 1.0, round_deadline_s: 300}
train: {local_epochs: 1, batch_size: 32, $train}
split: {$3}
local: {data: "fmnist:$fmnist,limit=4000", partition: iid, clients: 2$4}
YAML
}
# run NAME: cleave local into $out/NAME; its exit code (a refused server fails the run).
run() {
  rm -rf "${out:?}/$1"
  "$bin/cleave" local --insecure --config "$out/$1.yaml" --run-dir "$out/$1" > "$out/$1.log" 2>&1 && echo 0 || echo $?
}
accuracy() { grep -oE 'final test acc +[0-9.]+%' "$out/$1.log" | grep -oE '[0-9.]+%' || echo "—"; }

parts=${PARTS:-1 2 3}
if [[ " $parts " == *" 1 "* ]]; then
echo "### 1. Feature-space hijacking of unguarded devices: the hijack's SSIM by round"
echo
printf '| cut | round 1 | round 2 | round 3 | round 4 | round 5 | round 6 | mean image |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n'
for cut in 1 2 3; do
  name=hijack-cut$cut
  job "$name" 6 "mode: sfl-v2, cut: $cut, hijack: fsha, record: 4" ""
  rc=$(run "$name")
  [ "$rc" = 0 ] || { tail -20 "$out/$name.log"; exit 1; }
  "$bin/cleave" attack hijack "$out/$name" --grid "$out/$name.png" > "$out/$name.attack"
  row=$(grep '^round' "$out/$name.attack" | sed -E 's/.*hijack SSIM ([0-9.]+).*/\1/' | paste -sd'|' | sed 's/|/ | /g')
  mean=$(grep '^total' "$out/$name.attack" | sed -E 's/.*the mean image SSIM ([0-9.]+).*/\1/')
  echo "| $cut | $row | $mean |"
done
fi
if [[ " $parts " == *" 2 "* ]]; then
echo
echo "### 2. The same server against guarded devices (local.split_guard)"
echo
printf '| cut | refused | fakes sent when it refused (per device) | micro-batches the server trained on | SSIM of all it read before |\n| --- | --- | --- | --- | --- |\n'
for cut in 1 2 3; do
  name=guarded-cut$cut
  job "$name" 6 "mode: sfl-v2, cut: $cut, hijack: fsha, record: 1000" ", split_guard: true"
  rc=$(run "$name")
  refused=$( (grep -l "training hijacking suspected" "$out/$name"/client-*.log 2>/dev/null || true) | wc -l)
  fakes=$(grep -h "training hijacking suspected" "$out/$name"/client-*.log | grep error | grep -oE 'of [0-9]+ fake' | grep -oE '[0-9]+' | paste -sd, || true)
  batches=0
  for f in "$out/$name"/record/round-*/*.pb; do
    [ -e "$f" ] && batches=$(( batches + $(/usr/bin/python3 -c "import sys; b=open(sys.argv[1],'rb').read(); print(b.count(b'act/'))" "$f") ))
  done
  ssim=$("$bin/cleave" attack hijack "$out/$name" --grid "$out/$name.png" 2>/dev/null | grep '^total' | sed -E 's/.*hijack SSIM ([0-9.]+).*/\1/' || echo "—")
  echo "| $cut | $refused of 2 devices (exit $rc) | ${fakes:-—} | $batches | ${ssim:-—} |"
done

fi
if [[ " $parts " == *" 3 "* ]]; then
echo
echo "### 3. An honest server: the guard's false alarms and cost"
echo
printf '| mode | cut | refused | mean score (last round, per device) | test accuracy, guard off | guard on |\n| --- | --- | --- | --- | --- | --- |\n'
for mode in sl sfl-v2; do
  for cut in 1 2 3 4; do
    off=honest-$mode-cut$cut
    on=guard-$mode-cut$cut
    job "$off" 6 "mode: $mode, cut: $cut" ""
    job "$on" 6 "mode: $mode, cut: $cut" ", split_guard: true"
    rc_off=$(run "$off")
    rc_on=$(run "$on")
    [ "$rc_off" = 0 ] || { tail -20 "$out/$off.log"; exit 1; }
    refused=$( (grep -l "training hijacking suspected" "$out/$on"/client-*.log 2>/dev/null || true) | wc -l)
    scores=$(for c in "$out/$on"/client-*.log; do (grep -oE 'SplitGuard: mean score [0-9.]+' "$c" || true) | tail -1 | grep -oE '[0-9.]+$' || true; done | paste -sd,)
    echo "| $mode | $cut | $refused of 2 (exit $rc_on) | ${scores:-—} | $(accuracy "$off") | $(accuracy "$on") |"
  done
done
fi
