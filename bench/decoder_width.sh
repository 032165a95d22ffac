#!/usr/bin/env bash
# Width-scaled decoders (section width on model.name gpt; issue 39), run by `cleave local`
# as real processes on Debian's fortunes (8 clients, a share of the category files each:
# a natural non-IID text federation). The decoder of bench/lora_ranks.sh (4 blocks of 4
# heads, dim 128) trained from scratch for ROUNDS rounds of 25 local AdamW steps, the
# same seed and data everywhere:
#   heterofl   two clients train the whole decoder, three half of every block's heads and
#              MLP features, three a quarter (HeteroFL's leading windows)
#   fedrolex   the same tiers with FedRolex's rolling windows
#   all-1-4    everyone trains the quarter-width decoder the smallest tier can hold
#   top-only   only the top tier trains: two clients holding a quarter of the sequences
# Prints the held-out perplexity of the server's model by round (all-1-4's whole model is
# mostly untrained: its own quarter-width model is measured at the end), then each tier's
# submodel (cleave evaluate --width) and the bytes each run uploaded.
#   bench/decoder_width.sh [ROUNDS=8]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-8}
. bench/common.sh
bench_workdir decoder-width
text="text:/usr/share/games/fortunes,context=64"
run() {  # NAME CLIENTS DATA [WIDTH-SECTION]
  cat <<YAML
run: {name: decoder-width-$1, rounds: $rounds, seed: 1}
model: {name: gpt, gpt: {vocab: 256, context: 64, layers: 4, heads: 4, dim: 128}}
data: {test: "$text", test_limit: 512}
clients: {min: $2, quorum: 1.0, round_deadline_s: 600}
train: {local_steps: 25, batch_size: 32, optimizer: adamw, lr: 0.002, weight_decay: 0.01, clip_norm: 1.0}
local: {data: "$3", partition: natural, clients: $2}
${4:-}
YAML
}
tiers="clients: [{name: client-2, rate: 0.5}, {name: client-3, rate: 0.5}, {name: client-4, rate: 0.5},
                   {name: client-5, rate: 0.25}, {name: client-6, rate: 0.25}, {name: client-7, rate: 0.25}]"
sequences=$(/usr/bin/python3 -c "
import os
n = 0
for f in os.listdir('/usr/share/games/fortunes'):
    p = os.path.join('/usr/share/games/fortunes', f)
    if os.path.isfile(p) and not f.endswith('.dat') and not f.endswith('.u8'):
        n += os.path.getsize(p)
print(n // 64)")
run heterofl 8 "$text" "width: {method: heterofl, $tiers}" > "$work/heterofl.yaml"
run fedrolex 8 "$text" "width: {method: fedrolex, $tiers}" > "$work/fedrolex.yaml"
run all-1-4 8 "$text" "width: {rate: 0.25}" > "$work/all-1-4.yaml"
run top-only 2 "$text,limit=$((sequences / 4))" > "$work/top-only.yaml"
runs="heterofl fedrolex all-1-4 top-only"
bench_run $runs
/usr/bin/python3 - "$work" $runs <<'PY'
import json, sys
work, runs = sys.argv[1], sys.argv[2:]
rows = {r: [j for j in map(json.loads, open(f"{work}/{r}/metrics.jsonl")) if not j.get("evaluation_only")] for r in runs}
print("round | " + " | ".join(runs))
for i in range(len(rows[runs[0]])):
    print(f"{i + 1:5d} | " + " | ".join(f"{rows[r][i]['test_perplexity']:.3f}" if i < len(rows[r]) else "" for r in runs))
print("bytes up, all rounds | " + " | ".join(f"{sum(x['bytes_up'] for x in rows[r]) / 1e6:.2f} MB" for r in runs))
PY
bench_widths heterofl 1 0.5 0.25
bench_widths fedrolex 1 0.5 0.25
echo "all-1-4 (its own quarter-width model): $("$bin/cleave" evaluate "$work/all-1-4" --width 0.25 | tail -1)"
