#!/usr/bin/env bash
# Per-device LoRA ranks (section width, method hetlora or flexlora; issue 39), run by
# `cleave local` as real processes on Debian's fortunes (8 clients, a share of the
# category files each: a natural non-IID text federation).
#
# First a base: the decoder of deploy/examples/fortunes-gpt.yaml trained by FedAvg for
# BASE_ROUNDS rounds of 50 local steps, exported. Then ROUNDS rounds of LoRA fine-tuning
# on it (25 local steps), the same seed, data and adapter scale (alpha / rank = 2)
# everywhere:
#   rank-2     everyone at rank 2 (the smallest device's), plain FedAvg of the adapters
#   rank-16    everyone at rank 16 (the largest), plain FedAvg
#   hetlora    two clients each at ranks 16, 8, 4 and 2, HetLoRA's zero-padded mean
#   flexlora   the same ranks, FlexLoRA's mean product factored back by SVD
# Prints the held-out perplexity of the server's model by round (the mixed runs' model is
# the rank-16 one), and the bytes each run uploaded.
#   bench/lora_ranks.sh [ROUNDS=8] [BASE_ROUNDS=4]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-8}
base_rounds=${2:-4}
. bench/common.sh
bench_workdir lora-ranks
text="text:/usr/share/games/fortunes,context=64"
common() {  # NAME ROUNDS LR LOCAL-STEPS
  cat <<YAML
run: {name: lora-ranks-$1, rounds: $2, seed: 1}
data: {test: "$text", test_limit: 512}
clients: {min: 8, quorum: 1.0, round_deadline_s: 600}
train: {local_steps: $4, batch_size: 32, optimizer: adamw, lr: $3, weight_decay: 0.01, clip_norm: 1.0}
local: {data: "$text", partition: natural, clients: 8}
YAML
}
gpt="gpt: {vocab: 256, context: 64, layers: 4, heads: 4, dim: 128}"
{ common base "$base_rounds" 0.002 50; echo "model: {name: gpt, $gpt}"; } > "$work/base.yaml"
lora() {  # NAME RANK [WIDTH-SECTION]
  common "$1" "$rounds" 0.005 25
  echo "model: {name: gpt, $gpt, weights: $work/base.safetensors, lora: {rank: $2, alpha: $(( 2 * $2 ))}}"
  echo "${3:-}"
}
ranks="clients: [{name: client-2, rate: 0.5}, {name: client-3, rate: 0.5}, {name: client-4, rate: 0.25},
                 {name: client-5, rate: 0.25}, {name: client-6, rate: 0.125}, {name: client-7, rate: 0.125}]"
lora rank-2 2 > "$work/rank-2.yaml"
lora rank-16 16 > "$work/rank-16.yaml"
lora hetlora 16 "width: {method: hetlora, $ranks}" > "$work/hetlora.yaml"
lora flexlora 16 "width: {method: flexlora, $ranks}" > "$work/flexlora.yaml"
runs="rank-2 rank-16 hetlora flexlora"
for r in base $runs; do
  bench_run "$r"
  [ "$r" != base ] || "$bin/cleave" export "$work/base" --out "$work/base.safetensors" > /dev/null
done
/usr/bin/python3 - "$work" $runs <<'PY'
import json, sys
work, runs = sys.argv[1], sys.argv[2:]
def rounds(run):
    return [j for j in map(json.loads, open(f"{work}/{run}/metrics.jsonl")) if not j.get("evaluation_only")]
base = rounds("base")
rows = {r: rounds(r) for r in runs}
print(f"base after {len(base)} rounds: perplexity {base[-1]['test_perplexity']:.3f}")
print("round | " + " | ".join(runs))
for i in range(len(rows[runs[0]])):
    print(f"{i + 1:5d} | " + " | ".join(f"{rows[r][i]['test_perplexity']:.3f}" if i < len(rows[r]) else "" for r in runs))
print("bytes up, all rounds | " + " | ".join(f"{sum(x['bytes_up'] for x in rows[r]) / 1e6:.2f} MB" for r in runs))
PY
