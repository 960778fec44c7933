# moeshard: two commands on a fresh Debian 12 machine.
#   make run    build, make the default model, and generate text with it
#   make test   build and run every test (unit, golden, end-to-end, sanitizers)
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
CMAKE_FLAGS ?=
MODEL      ?= $(BUILD)/models/muse-spark-tiny-nvfp4
PROMPT     ?= The quick brown fox

.PHONY: all deps build run test test-unit test-asan clean

all: build

deps:
	@bash scripts/install_deps.sh

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

$(MODEL)/config.json: | build
	$(BUILD)/moeshard make-model --arch muse_spark --preset tiny --nvfp4 --seed 7 --out $(MODEL)

run: build $(MODEL)/config.json
	$(BUILD)/moeshard generate --model $(MODEL) --prompt "$(PROMPT)" -n 32 --temperature 0.8 --seed 1

test-unit: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The parsers, tokenizer and engine core again under AddressSanitizer + UBSan.
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMOESHARD_SANITIZE=ON -DMOESHARD_ONLY_CORE=ON -DMOESHARD_CUDA=OFF
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target formats_test tokenizer_test
	cd $(ASAN_BUILD) && ctest --output-on-failure -R 'formats_test|tokenizer_test'

test: test-unit test-asan

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
