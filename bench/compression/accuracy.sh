#!/usr/bin/env bash
# Accuracy and bytes per codec in the published non-IID setting (10 clients, Dirichlet
# 0.5, LeNet-5; deploy/examples/fmnist-niid-bench.yaml), the same number of rounds for
# every codec, then int8 activations and gradients in sfl-v2. Prints a Markdown table.
#   bench/compression/accuracy.sh [ROUNDS=10] [CODEC ...]
# Runs one federation at a time (about 12 s a round on 2 cores); run directories go to
# runs/bench-compression-ROUNDS/. SPLIT=0 skips the two sfl-v2 runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-10}
shift || true
codecs=("$@")
if [ ${#codecs[@]} -eq 0 ]; then
  codecs=(none fp16 bf16 int8 int8:channel int8:sr qsgd:4 topk:0.01 topk:0.01:ef21 randk:0.01 sign
          powersgd:2)
fi
out=runs/bench-compression-$rounds
split=${SPLIT:-1}
mkdir -p "$out"

run() {  # run NAME BASE_CONFIG COMPRESSION_YAML
  local dir="$out/$1"
  rm -rf "$dir"
  mkdir -p "$dir"
  { cat "$2"; echo "compression: $3"; } > "$dir.yaml"
  ./build/bin/cleave local --config "$dir.yaml" --rounds "$rounds" --run-dir "$dir" > "$dir.log" 2>&1
}

for c in "${codecs[@]}"; do
  run "fedavg-${c//:/-}" deploy/examples/fmnist-niid-bench.yaml "{update: \"$c\"}"
done
if [ "$split" = 1 ]; then
  run sfl-v2-none bench/split/fmnist-niid-sfl-v2.yaml "{}"
  run sfl-v2-int8 bench/split/fmnist-niid-sfl-v2.yaml "{activations: int8, gradients: int8}"
fi

python3 - "$out" "$rounds" "$split" "${codecs[@]}" <<'PY'
import json, sys
out, rounds, split, codecs = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4:]
def load(name):
    return [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")]
def row(label, name, base, key_up="bytes_up"):
    m = load(name)
    up = sum(r[key_up] for r in m) / len(m)
    acc = 100 * m[-1]["test_accuracy"]
    ref = 100 * load(base)[-1]["test_accuracy"]
    base_up = sum(r[key_up] for r in load(base)) / len(load(base))
    print(f"| {label} | {up / 1e6:.3f} | {base_up / up:.1f}x | {acc:.2f} | {acc - ref:+.2f} |")
print(f"After {rounds} rounds.\n")
print("| codec (compression.update) | MB up per round | fewer bytes than fp32 | test accuracy % | vs fp32 (points) |")
print("| --- | --- | --- | --- | --- |")
for c in codecs:
    row(c, "fedavg-" + c.replace(":", "-"), "fedavg-none")
if split:
    print("\n| sfl-v2 | MB of activations up per round | fewer bytes than fp32 | test accuracy % | vs fp32 (points) |")
    print("| --- | --- | --- | --- | --- |")
    for c in ["none", "int8"]:
        row(c, "sfl-v2-" + c, "sfl-v2-none", "activation_bytes_up")
PY
