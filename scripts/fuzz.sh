#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang-14, writes their seed corpus from real
# messages, and runs each for a bounded time. Findings (crash-*, leak-*, timeout-*) land
# in the build directory's findings/ and make the script fail.
#   scripts/fuzz.sh [--seconds N] [--build-dir DIR] [--jobs N]
# `make fuzz` runs 60 s per target; the test suite runs 5 s per target (fuzz.Smoke).
set -euo pipefail
seconds=60
build=build-fuzz
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --build-dir) build="$2"; shift 2 ;;
    *) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
src="$(cd "$(dirname "$0")/.." && pwd)"
case "$build" in /*) ;; *) build="$src/$build" ;; esac
for tool in clang++-14; do
  command -v "$tool" >/dev/null || { echo "fuzz.sh: $tool is missing (scripts/install-deps.sh)" >&2; exit 2; }
done
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLEAVE_FUZZ=ON \
  -DCMAKE_CXX_COMPILER=clang++-14 >/dev/null
cmake --build "$build" >/dev/null
corpus="$build/corpus"
rm -rf "$corpus"
"$build/bin/make_corpus" "$src" "$corpus"
findings="$build/findings"
mkdir -p "$findings"
status=0
for target in parameter_set_fuzz codec_fuzz checkpoint_fuzz buffer_journal_fuzz config_fuzz \
              upload_fuzz secagg_fuzz safetensors_fuzz split_chunks_fuzz chat_template_fuzz \
              hf_tokenizer_fuzz hf_config_fuzz pool_fuzz; do
  log="$build/$target.log"
  # Work on a copy of the seeds so that a run's discoveries do not grow the next seed set.
  work="$build/work/$target"
  rm -rf "$work" && mkdir -p "$work"
  if ! "$build/bin/$target" "$work" "$corpus/$target" -max_total_time="$seconds" \
       -max_len=65536 -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$findings/$target-" \
       -print_final_stats=1 >"$log" 2>&1; then
    echo "$target: FOUND A PROBLEM (see $log and $findings)"
    status=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
  echo "$target: $runs executions in ${seconds}s, coverage $cov edges"
done
# A Python strategy's return values (tests/python/fuzz_strategy.py), when the main
# build has made the Python package's native module.
if ls "$src"/python/cleave/_cleave*.so > /dev/null 2>&1; then
  if ! (cd "$src/tests/python" && PYTHONPATH="$src/python" /usr/bin/python3 fuzz_strategy.py \
          --seconds "$seconds" --seed "$RANDOM" > "$build/fuzz_strategy.log" 2>&1); then
    echo "fuzz_strategy: FOUND A PROBLEM (see $build/fuzz_strategy.log)"
    status=1
  fi
  tail -n 1 "$build/fuzz_strategy.log"
else
  echo "fuzz_strategy: skipped (no python/cleave/_cleave*.so: make python)"
fi
exit $status
