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

# The main job: the whole four-phase programme on the shipped data (configs/demo.yaml).
demo: build
	build/bin/hmla train configs/demo.yaml --out runs/demo

bench: build
	build/bin/hmla bench attention --json

clean:
	rm -rf build build-asan build-native
