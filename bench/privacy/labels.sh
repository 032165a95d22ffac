#!/usr/bin/env bash
# Label leakage from the gradients at the cut (issue 41; Li et al. 2022's setting): a
# binary task with a rare positive class, scikit-learn's breast-cancer table with nine
# in ten malignant rows dropped (21 malignant of 378, 5.6 %), an MLP cut after its first
# layer, two devices, one round of 4 steps of 32; the server records every micro-batch
# and `cleave attack labels` runs the norm and direction attacks, scored against the
# devices' true labels: sfl-v2 (the gradient the server sends back; the labels also
# cross in the clear), U-shaped (the gradient it receives; no label crosses), and
# U-shaped with label DP. Prints a Markdown table.
#   bench/privacy/labels.sh
# Run directories go to runs/bench-labels/.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=runs/bench-labels
mkdir -p "$out"
source bench/common.sh
bench_bin  # copies of the binaries: a rebuild meanwhile does not disturb the runs
/usr/bin/python3 - "$out/imbalanced.csv" <<'PY'
import sys
lines = open("/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv").read().splitlines()
out, malignant = [lines[0]], 0
for line in lines[1:]:
    if line.rsplit(",", 1)[1] == "0":
        malignant += 1
        if malignant % 10:
            continue
    out.append(line)
open(sys.argv[1], "w").write("\n".join(out) + "\n")
PY
table="csv:$out/imbalanced.csv,header=0,skip=1,standardise"
printf '| mode | norm attack AUC | direction attack AUC, accuracy | labels that crossed, true |\n| --- | --- | --- | --- |\n'
for v in "sfl-v2|mode: sfl-v2" "ushaped|mode: ushaped" "ushaped, label_epsilon 1|mode: ushaped, label_epsilon: 1" \
         "ushaped, label_epsilon 3|mode: ushaped, label_epsilon: 3"; do
  IFS='|' read -r name split <<< "$v"
  dir="$out/${name//[ ,]/-}"
  rm -rf "$dir"
  cat > "$dir.yaml" <<YAML
run: {name: bench-labels, rounds: 1, seed: 1}
model: {name: mlp, input: [30], classes: 2}
data: {test: "$table"}
clients: {min: 2, quorum: 1.0, round_deadline_s: 120}
train: {local_steps: 4, batch_size: 32, lr: 0.05}
split: {$split, cut: 1, record: 4}
local: {data: "$table", partition: iid, clients: 2}
YAML
  "$bin/cleave" local --insecure --config "$dir.yaml" --run-dir "$dir" > "$dir.log" 2>&1 || { tail -20 "$dir.log"; exit 1; }
  line=$("$bin/cleave" attack labels "$dir" | grep '^total:')
  norm=$(sed -E 's/.*norm AUC ([0-9.]+).*/\1/' <<< "$line")
  direction=$(sed -E 's/.*direction AUC ([0-9.]+), accuracy ([0-9.]+ %).*/\1, \2/' <<< "$line")
  crossed=$(grep -oE 'crossed: [0-9.]+ % true' <<< "$line" | sed -E 's/crossed: //' || true)
  echo "| $name | $norm | $direction | ${crossed:-— (none crossed)} |"
done
