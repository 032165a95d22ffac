#!/usr/bin/env bash
# An edge client's peak resident memory (issue 37): a cleave-server running one round
# and one cleave-client, on loopback, the client under `/usr/bin/time -f %M`. Setups:
#   lenet         LeNet-5 on a 6,000-example IID part of Fashion-MNIST, one epoch of
#                 batch 32 (SGD with momentum)
#   decoder       a GPT-2-style decoder (6 blocks, width 256, 8 heads, context 128), 20
#                 AdamW steps of batch 16 on client 0's natural part of the fortunes
#   decoder-cut1  the same, split (sfl-v2) at cut 1: the client holds the embedding
#   lora          the decoder at 8 blocks of width 512 with LoRA rank 8 on every
#                 projection (a 97 MiB frozen base), 5 AdamW steps of batch 8
#   lora-batch1   the same, 2 steps of batch 1 (the base dominates)
# Prints the client's peak in KiB and its log's data line.
#   bench/client_memory.sh SETUP [CLIENT_BINARY] [-- CLIENT_FLAGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
setup=${1:?usage: bench/client_memory.sh SETUP [CLIENT_BINARY] [-- FLAGS]}
shift
client=build/bin/cleave-client
if [ $# -gt 0 ] && [ "$1" != "--" ]; then client=$1; shift; fi
[ "${1:-}" = "--" ] && shift
work=$(mktemp -d /tmp/cleave-client-memory-XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
port=$((20000 + RANDOM % 20000))
fortunes="text:/usr/share/games/fortunes,context=128"
decoder() {  # layers dim steps batch [a line more under model:]
  cat <<YAML
run: {name: client-memory, rounds: 1, seed: 1}
model:
  name: gpt
  gpt: {vocab: 256, context: 128, layers: $1, heads: 8, dim: $2}
${5:-}
data: {test: "$fortunes", test_limit: 64}
clients: {min: 1, quorum: 1.0, round_deadline_s: 600}
train: {local_steps: $3, batch_size: $4, optimizer: adamw, lr: 0.002}
server: {listen: "127.0.0.1:$port"}
YAML
}
case $setup in
  lenet)
    cat > "$work/job.yaml" <<YAML
run: {name: client-memory, rounds: 1, seed: 42}
model: {name: lenet5}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 1000}
clients: {min: 1, fraction: 1.0, quorum: 1.0, round_deadline_s: 300}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
server: {listen: "127.0.0.1:$port"}
YAML
    data=(--data fmnist:/usr/share/datasets/fashion-mnist --partition iid,client=0,of=10) ;;
  decoder) decoder 6 256 20 16 > "$work/job.yaml" ;;
  decoder-cut1) { decoder 6 256 20 16; echo "split: {mode: sfl-v2, cut: 1}"; } > "$work/job.yaml" ;;
  lora) decoder 8 512 5 8 "  lora: {rank: 8}" > "$work/job.yaml" ;;
  lora-batch1) decoder 8 512 2 1 "  lora: {rank: 8}" > "$work/job.yaml" ;;
  *) echo "unknown setup $setup" >&2; exit 2 ;;
esac
[ "$setup" = lenet ] || data=(--data "$fortunes" --partition natural,client=0,of=8)
build/bin/cleave-server --config "$work/job.yaml" --insecure --run-dir "$work/run" \
  > "$work/server.log" 2>&1 &
server=$!
for _ in $(seq 100); do grep -q listening "$work/server.log" && break; sleep 0.1; done
/usr/bin/time -f "peak_kb %M" "$client" --server "127.0.0.1:$port" --insecure "${data[@]}" \
  --torch-threads 1 "$@" > "$work/client.log" 2>&1 || { cat "$work/client.log" >&2; exit 1; }
wait $server
grep -E "local training examples" "$work/client.log" | sed 's/.*\] //'
grep -E "^peak_kb" "$work/client.log"
