#!/usr/bin/env bash
# Split learning's privacy frontier (issue 41): for every cut of LeNet-5 and each
# defense, what a curious server recovers and what the defense costs, each cell from the
# same seeds. Four IID devices of Fashion-MNIST (2,000 images each) train sfl-v2 (or
# U-shaped, tail 1) for ROUNDS rounds of 100 steps; the server records each task's first
# two micro-batches (split.record: 2), and the last round's records are attacked:
#   cleave attack images  a learned inverter (He et al. 2019) trained on the server's
#                         test images, and white-box optimisation (UnSplit), scored with
#                         SSIM against the devices' own copies of what they sent
#   cleave attack labels  the gradients' direction (Li et al. 2022) and, in sl/sfl, the
#                         labels that crossed, against the devices' true labels
# Prints a Markdown table (bench/split/frontier_table.py, which also plots accuracy
# against SSIM in OUT/frontier.svg); each cell's reconstruction grid (PNG: the devices'
# inputs, learned, optimised) is left in OUT/grids.
#   bench/split/frontier.sh [ROUNDS=5] [CUTS="1 2 3 4"]
# Run directories go to runs/bench-frontier-ROUNDS/ (OUT); a cell measured there already
# is kept (delete OUT to start again).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-5}
cuts=${2:-"1 2 3 4"}
out=runs/bench-frontier-$rounds
mkdir -p "$out/grids"
source bench/common.sh
bench_bin  # copies of the binaries: a rebuild meanwhile does not disturb the runs
# name|split options|compression options
defenses=("none||" "noise-0.5|activation_noise: 0.5|" "noise-1|activation_noise: 1|"
          "noise-2|activation_noise: 2|" "nopeek-0.5|nopeek: 0.5|" "nopeek-2|nopeek: 2|"
          "int8||activations: int8" "qsgd-4||activations: \"qsgd:4\"" "topk-0.1||activations: \"topk:0.1:noef\"" "ushaped|mode: ushaped|"
          "labeldp-1|label_epsilon: 1|" "labeldp-3|label_epsilon: 3|")
for cut in $cuts; do
  for d in "${defenses[@]}"; do
    IFS='|' read -r name split compression <<< "$d"
    # U-shaped keeps the last stage on the device: the server needs one before it.
    if [ "$name" = ushaped ] && [ "$cut" -ge 4 ]; then continue; fi
    dir="$out/cut$cut-$name"
    # Cells already measured (their attacks ran) are kept: rerunning resumes.
    if [ -s "$dir.labels" ] || [ -s "$dir.failed" ]; then continue; fi
    rm -rf "$dir"
    mode="mode: sfl-v2, "
    [ "$name" = ushaped ] && mode=""
    cat > "$dir.yaml" <<YAML
run: {name: bench-frontier, rounds: $rounds, seed: 42}
model: {name: lenet5}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist"}
clients: {min: 4, quorum: 1.0, round_deadline_s: 600}
train: {local_steps: 100, batch_size: 32, lr: 0.02, momentum: 0.9}
split: {${mode}cut: $cut, record: 2${split:+, $split}}
compression: {${compression}}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=8000", partition: iid, partition_seed: 42, clients: 4}
YAML
    start=$(date +%s)
    # A run that fails (training diverged, say) is a result too: its reason goes in the table.
    if ! "$bin/cleave" local --insecure --config "$dir.yaml" --run-dir "$dir" > "$dir.log" 2>&1; then
      grep -h 'run ended' "$dir/server.log" | tail -1 | sed -E 's/.*run ended: //' > "$dir.failed"
      [ -s "$dir.failed" ] || echo "the run failed: $dir.log" > "$dir.failed"
      echo "cut $cut, $name: failed: $(cat "$dir.failed")" >&2
      continue
    fi
    "$bin/cleave" attack images "$dir" --round "$rounds" --grid "$out/grids/cut$cut-$name.png" > "$dir.images" 2>&1 ||
      { cat "$dir.images"; exit 1; }
    "$bin/cleave" attack labels "$dir" --round "$rounds" > "$dir.labels" 2>&1 || { cat "$dir.labels"; exit 1; }
    echo "cut $cut, $name: $(( $(date +%s) - start )) s" >&2
  done
done
/usr/bin/python3 bench/split/frontier_table.py "$out" "$rounds" "$cuts" "${defenses[@]%%|*}"
