# The two commands of the README:
#   make demo   installs what is missing, builds, runs the default local federation
#   make test   installs what is missing, builds, runs the test suite
BUILD ?= build
CONFIG ?= deploy/examples/fmnist-fedavg.yaml

.PHONY: demo test test-all test-asan test-tsan fuzz build deps bench clean

demo: build
	./$(BUILD)/bin/cleave local --config $(CONFIG)

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600 -LE slow

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

# Every fuzz target for 60 s from its seed corpus (scripts/fuzz.sh).
fuzz: deps
	./scripts/fuzz.sh --seconds 60

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(BUILD)

deps:
	./scripts/install-deps.sh

clean:
	rm -rf $(BUILD)
