# The two entry points of a fresh machine: `make run` and `make test`.
MAKEFLAGS += --no-print-directory
PRESET ?= cpu
BUILD_DIR := build/$(PRESET)
JOBS ?= $(shell nproc)

.PHONY: run test sanitize build bootstrap clean

bootstrap:
	@scripts/bootstrap.sh

build: bootstrap
	@cmake --preset $(PRESET) >/dev/null
	@cmake --build --preset $(PRESET) -j $(JOBS)

run: build
	@$(BUILD_DIR)/tools/tilemoe/tilemoe run --trace $(BUILD_DIR)/trace.json

test: build
	@ctest --preset $(PRESET) -j $(JOBS)

# The CPU tests (the CLI's bad-input tests among them) built and run under AddressSanitizer and
# UndefinedBehaviorSanitizer; the first finding stops the test that made it (halt_on_error=1).
sanitize: bootstrap
	@cmake --preset cpu-sanitize >/dev/null
	@cmake --build --preset cpu-sanitize -j $(JOBS)
	@ctest --preset cpu-sanitize -j $(JOBS)

clean:
	rm -rf build
