# Shared by the bench scripts that compare federations run with `cleave local`; sourced
# from the checkout's root.

# bench_workdir NAME: $work, a temporary folder removed on exit unless KEEP is set, and
# $bin in it, copies of the binaries (a rebuild while the benchmark runs changes nothing).
bench_workdir() {
  work=$(mktemp -d "/tmp/cleave-$1-XXXXXX")
  [ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
  bin=$work/bin
  mkdir -p "$bin"
  cp build/bin/cleave build/bin/cleave-server build/bin/cleave-client "$bin"/
}

# bench_daemon_auth: a daemon's policy ($work/policy.yaml) with one administrator,
# `bench`, and its bearer token ($work/token), for the daemon benchmarks' `cleave job`.
bench_daemon_auth() {
  cat > "$work/policy.yaml" <<YAML
identities: {bench: [admin]}
tokens: {$(printf bench-token-0123456789 | sha256sum | cut -d' ' -f1): bench}
YAML
  printf bench-token-0123456789 > "$work/token"
}

# bench_bin: $bin, a temporary folder (removed on exit) holding copies of the binaries,
# for benchmarks whose run directories stay (under runs/).
bench_bin() {
  bin=$(mktemp -d)
  trap 'rm -rf "$bin"' EXIT
  cp build/bin/cleave build/bin/cleave-server build/bin/cleave-client "$bin"/
}

# bench_run RUN...: `cleave local` on $work/RUN.yaml into $work/RUN, each in turn, timed;
# on a failure the log's tail, and the script exits.
bench_run() {
  local r start
  for r in "$@"; do
    start=$(date +%s)
    "$bin/cleave" local --insecure --config "$work/$r.yaml" --run-dir "$work/$r" > "$work/$r.out" 2>&1 ||
      { tail -30 "$work/$r.out"; exit 1; }
    echo "$r: $(( $(date +%s) - start )) s"
  done
}

# bench_widths RUN WIDTH...: each width's submodel of RUN's model, measured by `cleave
# evaluate` (its last line).
bench_widths() {
  local r=$1 w
  shift
  for w in "$@"; do
    echo "$r, submodel width $w: $("$bin/cleave" evaluate "$work/$r" --width "$w" | tail -1)"
  done
}
