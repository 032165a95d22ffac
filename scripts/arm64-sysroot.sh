#!/usr/bin/env bash
# Makes an arm64 Debian 12 sysroot for cross-compiling cleave-client (cmake/aarch64.cmake):
# the arm64 builds of the client's libraries, unpacked (mmdebstrap --variant=extract runs no
# maintainer scripts and needs no emulation), absolute symlinks made relative so that they
# resolve inside the sysroot. libtorch-dev, libyaml-cpp-dev and libsentencepiece-dev are not
# Multi-Arch: same, so their arm64 builds cannot be installed beside the host's; a sysroot is
# the way. The same tree is qemu-aarch64's -L prefix when the client runs under emulation.
#   scripts/arm64-sysroot.sh [DIR]     (default build-arm64/sysroot; reused when complete)
set -euo pipefail
DIR=${1:-build-arm64/sysroot}
if [ -f "$DIR/.complete" ]; then exit 0; fi
PACKAGES=(
  libc6-dev libstdc++-12-dev
  libtorch-dev libopenblas0-pthread
  libgrpc++-dev libabsl-dev libprotobuf-dev
  libssl-dev libspdlog-dev libfmt-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev zlib1g-dev
  libcpp-httplib-dev libgtest-dev libgmock-dev libstb-dev libsentencepiece-dev
)
rm -rf "$DIR"
mkdir -p "$(dirname "$DIR")"
MIRRORS=$(mktemp)
trap 'rm -f "$MIRRORS"' EXIT
# The host's own Debian sources, so that the arm64 libraries are the host's versions (the
# host's protoc must match the arm64 libprotobuf).
grep -h '^URIs:\|^Suites:' /etc/apt/sources.list.d/*.sources 2>/dev/null |
  paste - - | while read -r _ uri _ suites; do
    for s in $suites; do echo "deb $uri $s main"; done
  done > "$MIRRORS"
if [ ! -s "$MIRRORS" ]; then echo "deb http://deb.debian.org/debian bookworm main" > "$MIRRORS"; fi
IFS=,; INCLUDE="${PACKAGES[*]}"; unset IFS
mmdebstrap --variant=extract --architectures=arm64 --include="$INCLUDE" bookworm "$DIR" "$MIRRORS"
# Absolute symlinks (/usr/lib/...) would point into the host: make each relative to its
# place inside the sysroot.
find "$DIR" -type l -lname '/*' -print0 | while IFS= read -r -d '' link; do
  inside=${link#"$DIR"}
  ln -sfn "$(realpath -sm --relative-to="$(dirname "$inside")" "$(readlink "$link")")" "$link"
done
# BLAS and LAPACK are chosen by update-alternatives, a maintainer script extraction skips:
# OpenBLAS (pthread), as scripts/install-deps.sh chooses on the host.
for lib in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
  ln -sf "openblas-pthread/$lib" "$DIR/usr/lib/aarch64-linux-gnu/$lib"
done
# gRPC's arm64 CMake package requires its code generators (not in libgrpc++-dev) and code
# generation runs them on the host: they are the host's (same version, protobuf-compiler-grpc).
for plugin in /usr/bin/grpc_*_plugin; do ln -sf "$plugin" "$DIR/usr/bin/"; done
touch "$DIR/.complete"
