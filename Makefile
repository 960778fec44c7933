# moeshard: two commands on a fresh Debian 12 machine.
#   make run    build, make the default model, and generate text with it
#   make test   build and run every test (unit, golden, end-to-end, sanitizers)
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_SECONDS ?= 10
JOBS       ?= $(shell nproc)
# ccache, where the machine has it, keeps rebuilds cheap; nothing needs it.
CCACHE     := $(shell command -v ccache 2>/dev/null)
CMAKE_FLAGS ?= $(if $(CCACHE),-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
# Unity builds: each target's C++ sources compiled 16 at a time as one translation unit, so the
# headers (gRPC, protobuf, Abseil, JSON, httplib) are parsed and their templates compiled once a
# batch instead of once a file: the release build 556 -> ~330 s here, the sanitizer build 572 ->
# ~320 s, the TSan build 208 -> ~110 s. scripts/check_unity.py (ctest check_unity) keeps
# file-local helpers' names distinct within a folder, so no file's call binds to a neighbour's
# overload. CUDA sources are not batched.
UNITY      ?= -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16
# The bundled demo model (models/muse-spark-demo, trained on the King James Bible) when present;
# otherwise a random-weight Muse Spark that make-model writes.
DEMO       := models/muse-spark-demo
MODEL      ?= $(if $(wildcard $(DEMO)/config.json),$(DEMO),$(BUILD)/models/muse-spark-tiny-nvfp4)
PROMPT     ?= In the beginning

.PHONY: all deps build run test test-unit test-asan test-e2e test-deploy test-fault test-security build-asan test-fuzz build-tsan test-tsan clean

all: build

deps:
	@bash scripts/install_deps.sh

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOESHARD_CPU_TESTS=OFF $(UNITY) $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

$(MODEL)/config.json: | build
	$(BUILD)/moeshard make-model --arch muse_spark --preset tiny --nvfp4 --seed 7 --out $(MODEL)

# Starts a local cluster (router, coordinator, 2 workers in tensor parallel) on the default model,
# sends one request through the OpenAI API, prints the answer, and stops the cluster.
run: build $(MODEL)/config.json
	@bash scripts/run_demo.sh $(BUILD) $(MODEL) "$(PROMPT)"

# Every CPU test runs once: in the sanitizer build (test-asan), except those labelled long (the
# larger test models' goldens and checks: minutes under ASan) and cudahost (CPU tests of code
# that only the CUDA build has), which the release build runs with the tests labelled gpu, which
# need its CUDA kernels (ctest reports them Skipped without a GPU; the GPU lane,
# scripts/gpu_lane.sh, runs them on one). The release build compiles only those tests
# (MOESHARD_CPU_TESTS=OFF). docs/TESTING.md says what runs where.
test-unit: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L 'gpu|long|cudahost'

# Every CPU test (formats, tokenizer, kernels, worker, comm, coordinator, router, CLI) under
# AddressSanitizer + UBSan: clang (a third faster to compile than g++ here), the libraries at -O1,
# the tests' own sources at -O0 (tests/CMakeLists.txt), line tables only; no CUDA. A test that
# skips fails (cmake/moeshard.cmake).
# The same build holds the libFuzzer targets (MOESHARD_FUZZ; test-fuzz runs them): the coverage
# they steer by only on the libraries they exercise (cmake/sanitizer_builds.cmake).
build-asan: deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja $(UNITY) $(CMAKE_FLAGS) -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DMOESHARD_SANITIZE=ON -DMOESHARD_FUZZ=ON -DMOESHARD_CUDA=OFF
	cmake --build $(ASAN_BUILD) -j $(JOBS)
test-asan: build-asan
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -LE 'gpu|long'

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

# The attacks of issue 15 against a live cluster (tests/security/run.sh): internal services
# without the cluster credential, slowloris, huge prompts, forged chat roles, the API key's reach.
test-security: build
	bash tests/security/run.sh $(BUILD)

# libFuzzer (clang) under ASan/UBSan, built by build-asan: the GGUF and safetensors readers, the
# tokenizer and chat template, the OpenAI request parser, the internal messages' validators and
# the internal services' real handlers (in-process gRPC), FUZZ_SECONDS each from the committed
# seeds (tests/fuzz/corpus), one target a core at a time. (A build of its own took 214 s here.)
test-fuzz: deps build build-asan
	bash tests/fuzz/run.sh $(ASAN_BUILD) $(FUZZ_SECONDS)

# ThreadSanitizer: the router (HTTP, gRPC, dispatch against fake coordinators), the hardened
# HTTP server, the coordinator's scheduler and block manager, the communicators' multi-rank tests.
TSAN_TESTS := router_test http_test comm_test scheduler_test block_manager_test
# clang: the build 214 s against g++'s 262 s here, and the tests 37 s against 74 s.
build-tsan:
	cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DMOESHARD_TSAN=ON -DMOESHARD_CUDA=OFF $(UNITY) $(CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_TESTS) moeshard-router
test-tsan: deps build-tsan
	cd $(TSAN_BUILD) && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  ctest --output-on-failure -R '^($(subst $(eval) ,|,$(TSAN_TESTS)))$$'

# One stage after the other. (Compiling the fuzz and TSan builds at nice 19 beside the other stages
# was tried: the live-cluster stages' many short waits then queue behind the compiler, and e2e
# took 520 s instead of 250.)
test: test-unit test-asan test-e2e test-deploy test-fault test-security test-fuzz test-tsan

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
