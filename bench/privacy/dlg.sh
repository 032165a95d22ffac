#!/usr/bin/env bash
# What a curious server recovers from single federated updates (issue 41): LeNet-5 on
# Fashion-MNIST, 4 IID devices, one round; the server keeps every update
# (server.record_updates) and `cleave attack updates` inverts each (DLG with iDLG's
# labels, 2000 steps), scored against the device's first batch. By batch size, with
# several local steps, under central DP (the server clips and noises the sum after it
# has seen each update) and under secure aggregation (it never holds one). Prints a
# Markdown table; the grids go to OUT/grids.
#   bench/privacy/dlg.sh
# Run directories go to runs/bench-dlg/ (OUT).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=runs/bench-dlg
mkdir -p "$out/grids"
source bench/common.sh
bench_bin  # copies of the binaries: a rebuild meanwhile does not disturb the runs
# name|clients|train options|other sections
variants=("batch-1|4|local_steps: 1, batch_size: 1|" "batch-2|4|local_steps: 1, batch_size: 2|"
          "batch-4|4|local_steps: 1, batch_size: 4|" "batch-8|4|local_steps: 1, batch_size: 8|"
          "batch-2-steps-5|4|local_steps: 5, batch_size: 2|"
          "batch-2-central-dp|4|local_steps: 1, batch_size: 2|dp: {noise: central}"
          "batch-2-secagg|6|local_steps: 1, batch_size: 2|secure_aggregation: {}")
printf '| setting | labels right | images | SSIM (each to its best match) |\n| --- | --- | --- | --- |\n'
for v in "${variants[@]}"; do
  IFS='|' read -r name clients train extra <<< "$v"
  dir="$out/$name"
  rm -rf "$dir"
  cat > "$dir.yaml" <<YAML
run: {name: bench-dlg, rounds: 1, seed: 42}
model: {name: lenet5}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 1000}
clients: {min: $clients, quorum: 1.0, round_deadline_s: 600}
train: {$train, lr: 0.1}
server: {record_updates: $clients}
${extra}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=4000", partition: iid, partition_seed: 42, clients: $clients}
YAML
  "$bin/cleave" local --insecure --config "$dir.yaml" --run-dir "$dir" > "$dir.log" 2>&1 || { tail -20 "$dir.log"; exit 1; }
  if "$bin/cleave" attack updates "$dir" --grid "$out/grids/$name.png" > "$dir.attack" 2>&1; then
    line=$(grep '^total:' "$dir.attack")
    labels=$(sed -E 's/total: ([0-9]+ of [0-9]+) labels right.*/\1/' <<< "$line")
    images=$(sed -E 's/.*right; ([0-9]+) images.*/\1/' <<< "$line")
    ssim=$(sed -E 's/.*reconstructed SSIM ([0-9.]+).*/\1/' <<< "$line")
    echo "| $name | $labels | $images | $ssim |"
  else
    echo "| $name | — | — | nothing to attack: $(sed -E 's/.*\((.*)\)/\1/' "$dir.attack") |"
  fi
done
