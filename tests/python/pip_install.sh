#!/usr/bin/env bash
# `pip install ./python` as a Python user runs it, offline, in a fresh virtualenv with
# Debian's packages visible and into a --target folder: each builds the package (its
# native module through CMake, in the build directory $1, already built here), and
# `import cleave` then works from outside the checkout, finding cleave-server.
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
export CLEAVE_BUILD_DIR="$1" CLEAVE_SKIP_DEPS=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
check='import cleave, cleave._cleave, os
assert not cleave.__file__.startswith(os.environ["SRC"]), cleave.__file__
assert os.access(cleave.local._server_binary(), os.X_OK)
print("imported", cleave.__file__)'
/usr/bin/python3 -m venv --system-site-packages "$tmp/v"
"$tmp/v/bin/pip" install --quiet --no-index --no-build-isolation "$src/python"
(cd "$tmp" && SRC="$src" "$tmp/v/bin/python" -c "$check")
/usr/bin/python3 -m pip install --quiet --no-index --no-build-isolation --no-deps --target "$tmp/t" "$src/python"
(cd "$tmp" && SRC="$src" PYTHONPATH="$tmp/t" /usr/bin/python3 -c "$check")
echo "pip_install: virtualenv and --target installs import"
