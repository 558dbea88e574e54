# Thin wrapper: every target first runs the idempotent dependency script (apt-get of whatever
# is missing on Debian 12), so each is one command on a fresh machine.
.PHONY: deps build test demo bench clean

JOBS ?= $(shell nproc)

deps:
	@bash scripts/deps.sh

build: deps
	cmake --preset default
	cmake --build --preset default -j $(JOBS)

test: build
	ctest --preset default -j $(JOBS)

# The main job. Until the training programme exists it runs the attention benchmark.
demo: build
	build/bin/hmla bench attention

bench: build
	build/bin/hmla bench attention --json

clean:
	rm -rf build build-asan build-native
