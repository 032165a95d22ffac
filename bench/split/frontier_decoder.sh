#!/usr/bin/env bash
# Split learning's privacy frontier for text (issue 41): for every cut of a small
# GPT-style decoder (vocab 256 bytes, context 64, 2 blocks of width 64, 4 heads: cuts 1
# to 3) and each defense, how many of the devices' tokens a curious server recovers and
# what the defense costs in test perplexity, each cell from the same seeds. Four devices
# of fortunes (one category each, natural partition) train sfl-v2 (or U-shaped, tail 1)
# for ROUNDS rounds of 30 steps; the server records each task's first two micro-batches
# and `cleave attack tokens` attacks the last round's: the nearest token embedding at the
# embedding cut and, at every cut, a learned token inverter trained on the server's test
# text, both scored against the devices' own copies. Prints a Markdown table.
#   bench/split/frontier_decoder.sh [ROUNDS=5] [CUTS="1 2 3"]
# Run directories go to runs/bench-frontier-decoder-ROUNDS/; a cell measured there
# already is kept (delete it to start again).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-5}
cuts=${2:-"1 2 3"}
out=runs/bench-frontier-decoder-$rounds
mkdir -p "$out"
source bench/common.sh
bench_bin  # copies of the binaries: a rebuild meanwhile does not disturb the runs
text="text:/usr/share/games/fortunes,context=64"
# name|split options|compression options
defenses=("none||" "noise-0.1|activation_noise: 0.1|" "noise-0.3|activation_noise: 0.3|"
          "noise-1|activation_noise: 1|" "nopeek-0.5|nopeek: 0.5|" "int8||activations: int8"
          "topk-0.1||activations: \"topk:0.1:noef\""
          "ushaped|mode: ushaped|" "labeldp-8|label_epsilon: 8|")
for cut in $cuts; do
  for d in "${defenses[@]}"; do
    IFS='|' read -r name split compression <<< "$d"
    if [ "$name" = ushaped ] && [ "$cut" -ge 3 ]; then continue; fi  # the head stays on the device
    dir="$out/cut$cut-$name"
    if [ -s "$dir.tokens" ]; then continue; fi  # measured already: rerunning resumes
    rm -rf "$dir"
    mode="mode: sfl-v2, "
    [ "$name" = ushaped ] && mode=""
    cat > "$dir.yaml" <<YAML
run: {name: bench-frontier-decoder, rounds: $rounds, seed: 42}
model: {name: gpt, gpt: {vocab: 256, context: 64, layers: 2, heads: 4, dim: 64}}
data: {test: "$text", test_limit: 256}
clients: {min: 4, quorum: 1.0, round_deadline_s: 600}
train: {local_steps: 30, batch_size: 16, optimizer: adamw, lr: 0.003}
split: {${mode}cut: $cut, record: 2${split:+, $split}}
compression: {${compression}}
local: {data: "$text", partition: natural, clients: 4}
YAML
    start=$(date +%s)
    "$bin/cleave" local --insecure --config "$dir.yaml" --run-dir "$dir" > "$dir.log" 2>&1 ||
      { tail -20 "$dir.log"; exit 1; }
    "$bin/cleave" attack tokens "$dir" --round "$rounds" > "$dir.tokens" 2>&1 || { cat "$dir.tokens"; exit 1; }
    echo "cut $cut, $name: $(( $(date +%s) - start )) s" >&2
  done
done
PYTHONPATH=bench/split /usr/bin/python3 - "$out" "$rounds" "$cuts" "${defenses[@]}" <<'PY'
import json, os, sys
from frontier_table import total
out, rounds, cuts, defenses = sys.argv[1], sys.argv[2], sys.argv[3].split(), [d.split("|")[0] for d in sys.argv[4:]]
print(f"GPT-style decoder on fortunes, 4 devices, {rounds} rounds of 30 steps; attacks on round {rounds}'s records.\n")
print("| cut | defense | test perplexity | tokens recovered, nearest embedding % | tokens recovered, learned inverter % |")
print("| --- | --- | --- | --- | --- |")
for cut in cuts:
    for name in defenses:
        d = f"{out}/cut{cut}-{name}"
        if not os.path.exists(f"{d}/metrics.jsonl"):
            continue
        ppl = [json.loads(l) for l in open(f"{d}/metrics.jsonl")][-1]["test_perplexity"]
        nearest = total(f"{d}.tokens", r"^total: recovered \d+ of \d+ tokens \(([0-9.]+) %\)")
        learned = total(f"{d}.tokens", r"learned inverter recovered \d+ of \d+ tokens \(([0-9.]+) %\)")
        print(f"| {cut} | {name} | {ppl:.2f} | {'—' if nearest is None else f'{nearest:.2f}'} | {learned:.2f} |")
PY
