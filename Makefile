# The two commands of the README:
#   make demo   installs what the binaries need, builds only them (cleave, cleave-server,
#               cleave-client), runs the default local federation
#   make test   installs what is missing (the tests' tools too), builds everything, runs
#               the test suite, as many tests at once as there are cores
BUILD ?= build
CONFIG ?= deploy/examples/fmnist-fedavg.yaml
BINARIES = cleave cleave-server cleave-client

.PHONY: demo test test-all test-asan test-tsan test-arm64 fuzz build binaries configure deps deps-run clean python

demo: binaries
	./$(BUILD)/bin/cleave local --config $(CONFIG)

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600 -LE slow -j$$(nproc)

# The Python package's native module, into python/cleave/ (docs/python.md): then
# PYTHONPATH=python, or pip install --no-build-isolation ./python in a virtualenv.
python: deps configure
	cmake --build $(BUILD) --target _cleave cleave-server

test-all: build
	cd $(BUILD) && ctest --output-on-failure --timeout 3600

# The suite under AddressSanitizer + UndefinedBehaviorSanitizer, or ThreadSanitizer, in
# its own build directory (docs/testing.md).
test-asan: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLEAVE_SANITIZE=address -DCLEAVE_BUILD_BENCH=OFF
	cmake --build build-asan
	cd build-asan && ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure --timeout 1200 -LE slow

test-tsan: deps
	cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLEAVE_SANITIZE=thread -DCLEAVE_BUILD_BENCH=OFF
	cmake --build build-tsan
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 ignore_noninstrumented_modules=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  ctest --output-on-failure --timeout 1200 -LE slow -j2

# ARM edge clients (docs/deployment.md): the client and its tests cross-compiled for arm64
# against a Debian arm64 sysroot, its tests run under qemu-user, then a federation with
# the arm64 client under qemu beside the host's server and a host client.
ARM64 ?= build-arm64
test-arm64:
	./scripts/install-deps.sh --arm64
	./scripts/arm64-sysroot.sh $(ARM64)/sysroot
	cmake -S . -B $(ARM64)/build -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64.cmake \
	  -DCLEAVE_ARM64_SYSROOT=$(CURDIR)/$(ARM64)/sysroot -DCLEAVE_BUILD_BENCH=OFF
	cmake --build $(ARM64)/build --target cleave-client core_test compression_test client_test
	cd $(ARM64)/build && ctest --output-on-failure --timeout 1200 -j2
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCLEAVE_ARM64_BUILD=$(CURDIR)/$(ARM64)/build -DCLEAVE_ARM64_SYSROOT=$(CURDIR)/$(ARM64)/sysroot
	cmake --build $(BUILD)
	cd $(BUILD) && ctest --output-on-failure --timeout 3600 -L arm64

# Every fuzz target for 60 s from its seed corpus (scripts/fuzz.sh).
fuzz: deps
	./scripts/fuzz.sh --seconds 60

build: deps configure
	cmake --build $(BUILD)

binaries: deps-run configure
	cmake --build $(BUILD) --target $(BINARIES)

configure:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo

deps:
	./scripts/install-deps.sh

# What building and running the binaries needs, without the tests' tools.
deps-run:
	./scripts/install-deps.sh --no-test-tools

clean:
	rm -rf $(BUILD)
