#!/usr/bin/env bash
# Checks that scripts/runtime-packages.txt names the Debian package of every shared
# library the shipped binaries load directly (DT_NEEDED), so the runtime image of
# deploy/Dockerfile can start them.
#   scripts/check-runtime-packages.sh BIN_DIR
set -euo pipefail
bin=${1:?BIN_DIR}
list="$(dirname "$0")/runtime-packages.txt"
missing=0
for exe in cleave cleave-server cleave-client cleave-spm; do
  libs=$(ldd "$bin/$exe")
  for so in $(readelf -d "$bin/$exe" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
    # "NAME => PATH (addr)", or the loader's "PATH (addr)" (code built position-independent
    # asks it for __tls_get_addr).
    path=$(awk -v s="$so" '$1 == s && $3 ~ /^\// {print $3; exit} $2 ~ /^\(/ && $1 ~ ("/" s "$") {print $1; exit}' <<< "$libs")
    if [ -z "$path" ]; then echo "$exe: $so is not found by ldd"; missing=1; continue; fi
    real=$(realpath "$path")
    # Debian 12 registers libraries under /lib or /usr/lib (merged /usr): try both.
    pkg=$(dpkg -S "$real" 2>/dev/null || dpkg -S "${real#/usr}" 2>/dev/null || true)
    pkg=${pkg%%:*}
    if [ -z "$pkg" ]; then echo "$exe: no package holds $real ($so)"; missing=1; continue; fi
    if ! grep -qx "$pkg" "$list"; then
      echo "$exe needs $so from $pkg, which $list does not name"; missing=1
    fi
  done
done
[ $missing = 0 ] && echo "every library the binaries load comes from a listed package"
exit $missing
