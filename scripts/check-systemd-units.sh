#!/usr/bin/env bash
# `systemd-analyze verify` on deploy/systemd's units, with their ExecStart pointed at
# the built binaries (verify checks that the command exists).
#   scripts/check-systemd-units.sh BIN_DIR
set -euo pipefail
bin=$(realpath "${1:?BIN_DIR}")
src="$(dirname "$0")/../deploy/systemd"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for unit in "$src"/*.service; do
  sed "s|/usr/local/bin/|$bin/|g" "$unit" > "$work/$(basename "$unit")"
done
# verify prints its findings (unknown keys, bad values, missing commands) and exits non-zero.
out=$(cd "$work" && systemd-analyze verify ./*.service 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then echo "$out"; exit 1; fi
echo "verified: $(cd "$work" && ls)"
