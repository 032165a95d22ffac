#!/usr/bin/env bash
# Language-model federations on Debian's fortunes: a decoder (model gpt: 4 blocks of
# width 128, context 64, bytes as tokens) pretrained centrally on half of the
# categories, then fine-tuned on the other half, each variant seeing the same number of
# tokens (ROUNDS rounds of 4 clients x 25 steps x 16 sequences, or one client x 100
# steps). Reports the held-out perplexity (the tail of every fine-tuning file) and the
# bytes moved. Variants: no fine-tuning, central full and LoRA fine-tuning, FedAvg full
# and LoRA, split learning (sfl-v2, U-shaped; full model, with int8 activations and
# gradients too, one scale per tensor and per token), and FedAvg with SGD against
# DiLoCo at equal rounds (equal bytes).
#   bench/lm/fortunes.sh [ROUNDS=5] [VARIANT...]
# With VARIANTs (the names below, e.g. sfl-v2 sfl-v2-int8-token) only those run; the
# table shows what the run directory holds (earlier results too).
# One federation at a time; everything goes to runs/bench-lm-fortunes-ROUNDS/ (a
# pretrained base already there, base.safetensors, is reused).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-5}
shift || true
only=" $* "
out=$PWD/runs/bench-lm-fortunes-$rounds
mkdir -p "$out/pretrain" "$out/finetune"
bin=$(mktemp -d)  # a copy of the binaries: a rebuild meanwhile does not disturb the runs
trap 'rm -rf "$bin"' EXIT
cp build/bin/cleave build/bin/cleave-server build/bin/cleave-client build/bin/cleave-spm "$bin"/
# Alternate categories (sorted by name) between pretraining and fine-tuning.
i=0
for f in $(ls /usr/share/games/fortunes | grep -v '\.' | sort); do
  [ -f "/usr/share/games/fortunes/$f" ] || continue
  if [ $((i % 2)) = 0 ]; then ln -sf "/usr/share/games/fortunes/$f" "$out/pretrain/$f"; else
    ln -sf "/usr/share/games/fortunes/$f" "$out/finetune/$f"; fi
  i=$((i + 1))
done
model="name: gpt, gpt: {vocab: 256, context: 64, layers: 4, heads: 4, dim: 128}"
common="data: {test: \"text:$out/finetune,context=64\", test_limit: 1024}"

run() {  # NAME CLIENTS ROUNDS MODEL-EXTRA TRAIN SPLIT-AND-MORE
  local name=$1 clients=$2 r=$3 extra=$4 train=$5 more=$6 data=${7:-finetune}
  [ "$only" = "  " ] || [ "$name" = pretrain ] || [[ "$only" == *" $name "* ]] || return 0
  rm -rf "$out/$name"
  cat > "$out/$name.yaml" <<YAML
run: {name: $name, rounds: $r, seed: 1}
model: {$model$extra}
$common
clients: {min: $clients, quorum: 1.0, round_deadline_s: 1800}
train: {$train}
local: {data: "text:$out/$data,context=64", partition: natural, clients: $clients}
$more
YAML
  "$bin/cleave" local --insecure --config "$out/$name.yaml" --run-dir "$out/$name" > "$out/$name.log" 2>&1 ||
    { echo "$name failed: see $out/$name.log"; tail -5 "$out/$name.log"; }
}

adamw="optimizer: adamw, weight_decay: 0.01, clip_norm: 1.0, batch_size: 16"
# Pretraining: one client on the other half, 4 x 300 steps of 32 sequences.
if [ ! -f "$out/base.safetensors" ]; then
  run pretrain 1 4 "" "optimizer: adamw, lr: 0.002, weight_decay: 0.01, clip_norm: 1.0, batch_size: 32, local_steps: 300" "" pretrain
  "$bin/cleave" export "$out/pretrain" --out "$out/base.safetensors" > /dev/null
fi
base=", weights: $out/base.safetensors"
lora="$base, lora: {rank: 8, alpha: 16}"
run central-full 1 "$rounds" "$base" "$adamw, lr: 0.002, local_steps: 100" ""
run central-lora 1 "$rounds" "$lora" "$adamw, lr: 0.005, local_steps: 100" ""
run fedavg-full 4 "$rounds" "$base" "$adamw, lr: 0.002, local_steps: 25" ""
run fedavg-lora 4 "$rounds" "$lora" "$adamw, lr: 0.005, local_steps: 25" ""
run sfl-v2 4 "$rounds" "$base" "$adamw, lr: 0.002, local_steps: 25" "split: {mode: sfl-v2, cut: 2}"
run sfl-v2-int8 4 "$rounds" "$base" "$adamw, lr: 0.002, local_steps: 25" \
  "split: {mode: sfl-v2, cut: 2}
compression: {activations: int8, gradients: int8}"
run sfl-v2-int8-token 4 "$rounds" "$base" "$adamw, lr: 0.002, local_steps: 25" \
  "split: {mode: sfl-v2, cut: 2}
compression: {activations: int8:token, gradients: int8:token}"
run ushaped 4 "$rounds" "$base" "$adamw, lr: 0.002, local_steps: 25" "split: {mode: ushaped, cut: 2, tail: 1}"
run sfl-v2-lora 4 "$rounds" "$lora" "$adamw, lr: 0.005, local_steps: 25" "split: {mode: sfl-v2, cut: 2}"
run ushaped-lora 4 "$rounds" "$lora" "$adamw, lr: 0.005, local_steps: 25" "split: {mode: ushaped, cut: 2, tail: 1}"
run fedavg-sgd 4 "$rounds" "$base" "optimizer: sgd, lr: 0.1, momentum: 0.9, clip_norm: 1.0, batch_size: 16, local_steps: 100" ""
run diloco 4 "$rounds" "$base" "$adamw, lr: 0.002, local_steps: 100" "strategy: {name: diloco}"

# Each client's held-out perplexity (the tails of its own files, all of them; the table
# above pools the first 1,024 held-out sequences): cleave evaluate --by client:4.
for dir in "$out"/*/; do
  name=$(basename "$dir")
  [ -f "$dir/checkpoint.pb" ] && [ "$name" != pretrain ] || continue
  "$bin/cleave" evaluate "$dir" --data "text:$out/finetune,context=64" --by client:4 > "$out/$name.eval.md" 2>&1 ||
    echo "evaluate $name failed: see $out/$name.eval.md"
done
[ -f "$out/base.safetensors" ] && [ -f "$out/fedavg-full/config.yaml" ] &&
  "$bin/cleave" evaluate --config "$out/fedavg-full/config.yaml" --checkpoint "$out/base.safetensors" \
    --data "text:$out/finetune,context=64" --by client:4 > "$out/base.eval.md" 2>&1

python3 - "$out" "$rounds" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def lines(name):
    return [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl") if '"evaluation_only"' not in l]
def row(name, label, note=""):
    try:
        ms = lines(name)
    except OSError:
        print(f"| {label} | (no result) | | | {note} |")
        return
    last = ms[-1]
    up = sum(m["bytes_up"] for m in ms)
    down = sum(m["bytes_down"] for m in ms)
    ppl = last["test_perplexity"]
    print(f"| {label} | {ppl:.3f} | {last['test_bits_per_byte']:.3f} | {(up + down) / 1e6:.1f} | {note} |")
    return ppl
print(f"Held-out perplexity on the fine-tuning categories after {rounds} rounds, on the server's test set\n"
      "(the first 1,024 held-out sequences; bytes: up + down, all rounds).\n")
print("| variant | perplexity | bits/byte | MB moved | |")
print("| --- | --- | --- | --- | --- |")
import math, re
initial = re.search(r"initial model: test accuracy [0-9.]+, loss ([0-9.]+)", open(f"{out}/fedavg-full/server.log").read())
if initial:
    loss = float(initial.group(1))
    print(f"| no fine-tuning (the pretrained base) | {math.exp(loss):.3f} | {loss / math.log(2):.3f} | 0 | |")
variants = [("central-full", "central, full model"), ("central-lora", "central, LoRA r=8"),
            ("fedavg-full", "FedAvg, full model"), ("fedavg-lora", "FedAvg-LoRA r=8"),
            ("sfl-v2", "sfl-v2, full model, cut 2"), ("sfl-v2-int8", "sfl-v2, int8 activations and gradients"),
            ("sfl-v2-int8-token", "sfl-v2, int8 per token row (int8:token)"),
            ("ushaped", "U-shaped, full model, cut 2, tail 1"),
            ("sfl-v2-lora", "sfl-v2-LoRA r=8, cut 2"), ("ushaped-lora", "U-shaped-LoRA r=8, cut 2, tail 1"),
            ("fedavg-sgd", "FedAvg, SGD inner, 100 steps"), ("diloco", "DiLoCo, AdamW inner, 100 steps")]
for name, label in variants:
    row(name, label)

def evals(name):
    try:
        rows = [l.split("|")[1:-1] for l in open(f"{out}/{name}.eval.md") if l.startswith("| ")]
    except OSError:
        return None
    if not rows:  # cleave evaluate failed: its message is in the file
        return None
    head = [c.strip() for c in rows[0]]
    col = head.index("perplexity")
    return [(r[0].strip().split(" (")[0], float(r[col])) for r in rows[2:]]
base = evals("base")
if base:
    print(f"\nHeld-out perplexity per client (client i holds fine-tuning files i, i + 4, ...; all of each file's tail):\n")
    print("| variant | " + " | ".join(n for n, _ in base) + " |")
    print("| --- " * (len(base) + 1) + "|")
    for name, label in [("base", "no fine-tuning")] + variants:
        e = evals(name)
        if e:
            print(f"| {label} | " + " | ".join(f"{p:.3f}" for _, p in e) + " |")
PY
