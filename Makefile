# The README's commands. Each first installs what it needs (scripts/deps).
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
CMAKE_FLAGS ?=
CTEST_FLAGS ?=

.PHONY: all deps build asan-build test test-normal asan demo bench install format clean python test-python

all: build

deps:
	@scripts/deps

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

asan-build: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DMPROC_SANITIZE=address,undefined \
	    -DMPROC_BUILD_EXAMPLES=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

# The whole suite twice: a normal build, then ASan+UBSan.
test: test-normal asan

test-normal: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_FLAGS)
	@$(MAKE) --no-print-directory test-python

# The Python package (python/): the _mproc extension in place, against $(BUILD).
PYTHON ?= /usr/bin/python3
python: build
	@cd python && MPROC_BUILD_DIR=$(abspath $(BUILD)) $(PYTHON) setup.py -q build_ext --inplace

test-python: python
	@scripts/pytest $(PYTHON) python tests/python

asan: asan-build
	@scripts/pytest-asan $(PYTHON) $(abspath $(ASAN_BUILD))
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS) -LE noasan $(CTEST_FLAGS)

demo: build
	$(BUILD)/hogwild

# The bench runner when it exists, else every bench_<name>, one JSON file each.
bench: build
	@mkdir -p bench/results
	@if [ -x $(BUILD)/bench_all ]; then $(BUILD)/bench_all; else \
	    for b in $(BUILD)/bench_*; do [ -x "$$b" ] || continue; n=$${b##*/bench_}; \
	        echo "== $$n" >&2; "$$b" | tee bench/results/$$n.jsonl || exit 1; done; fi
	@if $(PYTHON) -c 'import torch' 2>/dev/null; then $(MAKE) --no-print-directory python && \
	    echo "== python" >&2 && $(PYTHON) bench/python/bench_mp.py; fi

# make install PREFIX=/opt/mproc (default: the configured prefix, /usr/local); DESTDIR works.
install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX),)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) python/build python/mproc/*.so
