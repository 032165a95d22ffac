#!/usr/bin/env bash
# Token-budget micro-batches (split.micro_batch_tokens, issue 38), run by `cleave local`
# as real processes: instruction data of very unequal length (each of Debian's fortunes
# the answer to "Tell me a fortune from CATEGORY.", rendered by a two-line chat template,
# bytes as tokens, context 256: median 97 bytes a fortune, 18 % cut at the context),
# a decoder (gpt: 4 blocks of width 128) over one chain of three equal emulated devices
# (compute slowed 4x, so that the four processes do not contend for this machine's cores)
# holding the embedding and three blocks (split.cut: 4) and the server the last block
# and the head; batches of 32 sequences, 1F1B; two rounds of STEPS batches.
#
#   equal    split.micro_batches: 8 equal micro-batches, each cut after its longest
#            sequence's last target: one long fortune makes its micro-batch long.
#   tokens   split.micro_batch_tokens: BUDGET: the batch's sequences longest first,
#            packed within BUDGET tokens (count x longest).
#
# Both see the same batches and take the same (exact) steps, so their perplexities must
# agree; it prints each one's time per batch in the second round, the devices' busy
# shares and the number of micro-batches the owner sent.
#   bench/pipeline_tokens.sh [STEPS=10] [BUDGET=768]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-10}
budget=${2:-768}
work=$(mktemp -d /tmp/cleave-tokens-XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
bin=$work/bin  # a copy of the binaries: a rebuild meanwhile does not disturb the runs
mkdir -p "$bin"
cp build/bin/cleave build/bin/cleave-server build/bin/cleave-client "$bin"/
/usr/bin/python3 - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]
root = "/usr/share/games/fortunes"
os.makedirs(f"{work}/data")
n = 0
for name in sorted(os.listdir(root)):
    path = os.path.join(root, name)
    if os.path.islink(path) or not os.path.isfile(path) or "." in name:
        continue
    try:
        text = open(path, encoding="utf-8").read()
    except UnicodeDecodeError:
        continue
    with open(f"{work}/data/{name}.jsonl", "w") as out:
        for entry in text.split("\n%\n"):
            entry = entry.strip("\n%")
            if entry:
                out.write(json.dumps({"messages": [{"role": "user", "content": f"Tell me a fortune from {name}."},
                                                   {"role": "assistant", "content": entry}]}) + "\n")
                n += 1
print(f"{n} fortunes as instructions")
PY
cat > "$work/template.jinja" <<'JINJA'
{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}
{% else %}A: {{ m['content'] }}
{% endif %}{% endfor %}{% if add_generation_prompt %}A: {% endif %}
JINJA
data="instruct:$work/data,context=256,template=$work/template.jinja"
run() {  # NAME SPLIT
  cat <<YAML
run: {name: tokens-bench-$1, rounds: 2, seed: 1}
model: {name: gpt, gpt: {vocab: 256, context: 256, layers: 4, heads: 4, dim: 128}}
data: {test: "$data", test_limit: 256}
train: {local_steps: $steps, batch_size: 32, optimizer: adamw, lr: 0.002, weight_decay: 0.01}
clients: {min: 3, quorum: 1.0, round_deadline_s: 1200}
split: {mode: pipeline, cut: 4, devices: 3, schedule: 1f1b, $2}
local: {data: "$data", partition: iid, clients: 3, profiles: [{slowdown: 4}]}
YAML
}
run equal "micro_batches: 8" > "$work/equal.yaml"
run tokens "micro_batches: 8, micro_batch_tokens: $budget" > "$work/tokens.yaml"
for r in equal tokens; do
  start=$(date +%s)
  "$bin/cleave" local --insecure --config "$work/$r.yaml" --run-dir "$work/$r" > "$work/$r.out" 2>&1 ||
    { tail -30 "$work/$r.out"; exit 1; }
  echo "$r: $(( $(date +%s) - start )) s"
done
/usr/bin/python3 - "$work" "$steps" "$budget" <<'PY'
import json, math, sys
work, steps, budget = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def rows(run):
    return [r for r in (json.loads(l) for l in open(f"{work}/{run}/metrics.jsonl")) if not r.get("evaluation_only")]
wall = {}
for n in ("equal", "tokens"):
    r = rows(n)[-1]
    c = r["pipeline"][0]
    wall[n] = r["wall_s"] / steps
    first = 1 + max(x[1] for x in c["spans"] if x[0] == 0)  # [device, micro-batch, F/B, start, end]
    print(f"{n}: {wall[n]:.2f} s a batch (the second round's wall time / {steps}), busy "
          f"{', '.join(f'{b:.2f}' for b in c['busy'])}, bubble {c['bubble']:.2f}, {first} micro-batches in the first batch, "
          f"perplexity {math.exp(r['test_loss']):.4f}")
print(f"token budget {budget} against 8 equal micro-batches: {wall['equal'] / wall['tokens']:.2f}x faster")
PY
