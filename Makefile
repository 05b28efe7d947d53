# The README's two commands: `make run` and `make test`. Everything else is a convenience.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
MODEL ?= $(BUILD)/tiny-deepseek2.gguf
DEMO ?= tests/data/demo/tandem-demo-moe-Q4_K_M.gguf

.PHONY: all bootstrap configure build run test test-slow bench fuzz clean format python

all: build

bootstrap:
	@./scripts/bootstrap.sh

configure: bootstrap
	@if [ ! -f $(BUILD)/CMakeCache.txt ]; then \
	  cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS); fi

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The main job: machine facts, its limits, a synthesized model's summary, and the trained demo
# model (a small DeepSeek-V2-architecture MoE, tests/data/demo/README.md) writing text.
run: build
	$(BUILD)/tandem info
	$(BUILD)/tandem roofline
	$(BUILD)/tandem synth --arch deepseek2 --preset tiny --format gguf --type q4_k_m --seed 1 -o $(MODEL)
	$(BUILD)/tandem show -m $(MODEL)
	$(BUILD)/tandem run -m $(DEMO) -p "In the beginning" -n 100 --temp 0.8 --seed 42
	$(BUILD)/tandem bench -m $(DEMO) -p 128 -n 32

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L 'unit|model|gpu|server|python' -LE slow

test-slow: build
	cd $(BUILD) && ctest --output-on-failure -L slow

# The Python module into $(BUILD)/python/tandem: PYTHONPATH=$(BUILD)/python python3 -c 'import tandem'
python: configure
	cmake --build $(BUILD) --target python -j $(JOBS)

bench: build
	cmake --build $(BUILD) --target benchmarks -j $(JOBS)

clean:
	rm -rf $(BUILD)

format:
	git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | xargs clang-format -i
