# The README's commands. Each first installs what it needs (scripts/deps).
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
CMAKE_FLAGS ?=
CTEST_FLAGS ?=

.PHONY: all deps build asan-build test test-normal asan demo bench install format clean

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

asan: asan-build
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS) -LE noasan $(CTEST_FLAGS)

demo: build
	$(BUILD)/hogwild

# The bench runner when it exists, else every bench_<name>, one JSON file each.
# Results go into the build folder; `make bench UPDATE=1` writes the committed
# bench/results instead.
BENCH_OUT = $(if $(UPDATE),bench/results,$(BUILD)/bench-results)
bench: build
	@mkdir -p $(BENCH_OUT)
	@if [ -x $(BUILD)/bench_all ]; then $(BUILD)/bench_all --out $(BENCH_OUT); else \
	    for b in $(BUILD)/bench_*; do [ -x "$$b" ] || continue; n=$${b##*/bench_}; \
	        echo "== $$n" >&2; "$$b" | tee $(BENCH_OUT)/$$n.jsonl || exit 1; done; fi

# make install PREFIX=/opt/mproc (default: the configured prefix, /usr/local); DESTDIR works.
install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX),)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
