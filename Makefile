# zfeed: `make test` installs everything, builds, and runs every C++ and Python test and the
# fuzzers; `make demo` shows zfeed on the shared real data.
SHELL := /bin/bash
JOBS ?= $(shell nproc)
VENV := .venv
PY := $(VENV)/bin/python
FUZZ_SECONDS ?= 30
# One build of the Python package at a time (helpers and CI share build/python).
LOCK := flock build/.python.lock

.PHONY: all deps build python test test-cpp test-python fuzz demo bench bench-loader bench-remote format format-check clean

all: build python

deps:
	scripts/install-deps

# The sanitized build: C++ tests, the zfeed command and the benchmark helpers under ASan + UBSan.
# Configured every time (cheap), so the options always hold.
build:
	cmake -S . -B build/debug -G Ninja -DCMAKE_BUILD_TYPE=Debug -DZFEED_SANITIZE=ON -DZFEED_BUILD_TESTS=ON \
	  -DZFEED_BUILD_TOOLS=ON -DZFEED_BUILD_BENCH=ON -DZFEED_FUZZ=OFF > /dev/null
	ninja -C build/debug -j $(JOBS)

# The Python package (Release, no sanitizers) and the zfeed command, installed into .venv.
python:
	@mkdir -p build
	$(LOCK) $(VENV)/bin/pip install --no-build-isolation -q .

test-cpp: build
	cd build/debug && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure --timeout 600 -j $(JOBS)

test-python: python
	$(PY) -m pytest -q tests

# A fixed seed: each run of make test fuzzes the same way (scripts/fuzz alone draws new seeds).
fuzz:
	ZFEED_FUZZ_SEED=$${ZFEED_FUZZ_SEED:-1} scripts/fuzz $(FUZZ_SECONDS)

test: deps
	$(MAKE) format-check
	$(MAKE) test-cpp
	$(MAKE) test-python
	$(MAKE) fuzz

demo: deps python
	scripts/demo

bench: deps python
	$(PY) bench/read_bench.py

# The loader benchmark (zfeed bench): zfeed, the hackathon baseline, tensorstore and the zstd limit.
bench-loader: deps python
	$(PY) -m zfeed.bench --json docs/loader_bench.json --plot docs/loader_bench.png

# Remote reads over HTTP on loopback: zfeed, tensorstore and zarr-python.
bench-remote: deps python
	$(PY) bench/remote_read_bench.py --json docs/remote_read_bench.json --plot docs/remote_read_bench.png

FORMATTED = $$(git ls-files 'src/*.cc' 'src/*.h' 'src/*.cu' 'python/*.cc' 'python/*.h' 'bench/*.cc' 'fuzz/*.cc' 'fuzz/*.h')

format:
	clang-format -i $(FORMATTED)

# Fails, naming the files, where clang-format would change a C++ or CUDA source.
format-check:
	@unformatted=$$(for f in $(FORMATTED); do clang-format --dry-run -Werror "$$f" > /dev/null 2>&1 || echo "$$f"; done); \
	if [ -n "$$unformatted" ]; then echo "not clang-formatted (make format fixes them):"; echo "$$unformatted"; exit 1; fi

clean:
	rm -rf build
