# The two entry points of a fresh machine: `make run` and `make test`.
MAKEFLAGS += --no-print-directory
PRESET ?= cpu
BUILD_DIR := build/$(PRESET)
JOBS ?= $(shell nproc)

.PHONY: run test build bootstrap clean

bootstrap:
	@scripts/bootstrap.sh

build: bootstrap
	@cmake --preset $(PRESET) >/dev/null
	@cmake --build --preset $(PRESET) -j $(JOBS)

run: build
	@$(BUILD_DIR)/tools/tilemoe/tilemoe run --trace $(BUILD_DIR)/trace.json

test: build
	@ctest --preset $(PRESET) -j $(JOBS)

clean:
	rm -rf build
