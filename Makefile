# The two commands of the README:
#   make demo   installs what is missing, builds, runs the default local federation
#   make test   installs what is missing, builds, runs the test suite
BUILD ?= build
CONFIG ?= deploy/examples/fmnist-fedavg.yaml

.PHONY: demo test test-all build deps bench clean

demo: build
	./$(BUILD)/bin/cleave local --config $(CONFIG)

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600 -LE slow

test-all: build
	cd $(BUILD) && ctest --output-on-failure --timeout 3600

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(BUILD)

deps:
	./scripts/install-deps.sh

clean:
	rm -rf $(BUILD)
