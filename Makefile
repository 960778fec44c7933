# moeshard: two commands on a fresh Debian 12 machine.
#   make run    build, make the default model, and generate text with it
#   make test   build and run every test (unit, golden, end-to-end, sanitizers)
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
CMAKE_FLAGS ?=
# The bundled demo model (models/muse-spark-demo, trained on the King James Bible) when present;
# otherwise a random-weight Muse Spark that make-model writes.
DEMO       := models/muse-spark-demo
MODEL      ?= $(if $(wildcard $(DEMO)/config.json),$(DEMO),$(BUILD)/models/muse-spark-tiny-nvfp4)
PROMPT     ?= In the beginning

.PHONY: all deps build run test test-unit test-asan test-e2e test-deploy test-fault clean

all: build

deps:
	@bash scripts/install_deps.sh

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

$(MODEL)/config.json: | build
	$(BUILD)/moeshard make-model --arch muse_spark --preset tiny --nvfp4 --seed 7 --out $(MODEL)

# Starts a local cluster (router, coordinator, 2 workers in tensor parallel) on the default model,
# sends one request through the OpenAI API, prints the answer, and stops the cluster.
run: build $(MODEL)/config.json
	@bash scripts/run_demo.sh $(BUILD) $(MODEL) "$(PROMPT)"

# Every CPU test runs once, in the sanitizer build (test-asan); the release build runs the tests
# labelled gpu, which need its CUDA kernels (ctest reports them Skipped without a GPU; the GPU
# lane, scripts/gpu_lane.sh, runs them on one). docs/TESTING.md says what runs where.
test-unit: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L gpu

# Every CPU test (formats, tokenizer, kernels, worker, comm, coordinator, router, CLI) under
# AddressSanitizer + UBSan: Debug at -O1, no CUDA. A test that skips fails (cmake/moeshard.cmake).
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja $(CMAKE_FLAGS) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DMOESHARD_SANITIZE=ON -DMOESHARD_CUDA=OFF
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -LE gpu

# End-to-end: real clusters on loopback in both modes, real clients (openai, grpc-js, promtool).
test-e2e: build
	bash tests/e2e/run.sh $(BUILD)

# Deployment files: compose, YAML, Prometheus rules, dashboards against a live cluster.
test-deploy: build
	bash tests/deploy/run.sh $(BUILD)

# Faults: SIGKILL/SIGSTOP of workers, a coordinator and the router under streaming load, a burst
# past the queue bound, a bad model; a real cluster of the demo model on loopback (tests/fault/).
test-fault: build
	python3 tests/fault/fault_test.py --build $(BUILD) --model $(MODEL)

test: test-unit test-asan test-e2e test-deploy test-fault

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
