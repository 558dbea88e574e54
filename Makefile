# Thin wrapper: every target first runs the idempotent dependency script (apt-get of whatever
# is missing on Debian 12), so each is one command on a fresh machine.
.PHONY: deps build test demo demo-dense bench clean

JOBS ?= $(shell nproc)

deps:
	@bash scripts/deps.sh

build: deps
	cmake --preset default
	cmake --build --preset default -j $(JOBS)

test: build
	ctest --preset default -j $(JOBS)

# The main job: the whole four-phase programme on the seed's model, a tiny hybrid DeepSeek-V4
# stack, on the shipped data (configs/demo_hybrid.yaml), then the report. runs/demo is the demo's
# own directory: each `make demo` starts it afresh.
demo: build
	rm -rf runs/demo
	build/bin/hmla train configs/demo_hybrid.yaml --out runs/demo
	build/bin/hmla report runs/demo

# The same programme on the tiny dense hybrid-MLA model (configs/demo.yaml), into runs/demo-dense.
demo-dense: build
	rm -rf runs/demo-dense
	build/bin/hmla train configs/demo.yaml --out runs/demo-dense
	build/bin/hmla report runs/demo-dense

bench: build
	build/bin/hmla bench attention --json

clean:
	rm -rf build build-asan build-native
