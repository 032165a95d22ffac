#!/usr/bin/env bash
# Renders deploy/k8s (the base and every overlay) with `kubectl kustomize` after making
# the certificates and token the way docs/deployment.md says, and checks each rendering
# (tests/deploy/check_manifests.py).
#   scripts/check-k8s.sh BIN_DIR
set -euo pipefail
bin=$(realpath "${1:?BIN_DIR}")
root="$(cd "$(dirname "$0")/.." && pwd)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$root/deploy/k8s" "$work/k8s"
certs="$work/k8s/base/certs"
"$bin/cleave" certs init "$certs" --san cleave-coordinator --san 127.0.0.1 \
  --san cleave-edge-0.cleave-edge --san cleave-edge-1.cleave-edge > /dev/null
for c in edge-0 edge-1 operator; do "$bin/cleave" certs issue "$certs" "$c" > /dev/null; done
head -c 24 /dev/urandom | base64 > "$certs/token"
cp -r "$certs/clients" "$work/k8s/overlays/edges/certs"
daemon="$work/k8s/overlays/daemon/certs"  # the daemon overlay's own federation
"$bin/cleave" certs init "$daemon" --san cleave-daemon --san 127.0.0.1 > /dev/null
for c in site-0 site-1 site-2 operator; do "$bin/cleave" certs issue "$daemon" "$c" > /dev/null; done
status=0
cd "$work/k8s"
for dir in base overlays/*; do
  echo "== $dir"
  kubectl kustomize "$work/k8s/$dir" > "$work/rendered.yaml"
  /usr/bin/python3 "$root/tests/deploy/check_manifests.py" < "$work/rendered.yaml" || status=1
done
exit $status
