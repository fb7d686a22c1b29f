# The README's commands. Each first installs what it needs (scripts/deps).
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
DEB_BUILD ?= build-deb
CMAKE_FLAGS ?=
CTEST_FLAGS ?=
# WERROR=ON turns warnings into errors in every build below (.ci/run sets it).
WERROR ?= OFF
# Extra configure flags for the package build (libmproc loads the CUDA runtime
# with dlopen, so a package built with CUDA support depends on no CUDA package).
DEB_FLAGS ?=
# Quiet builds: the generated makefiles' sub-makes print no "Entering
# directory" lines (MAKEFLAGS reaches them; Ninja ignores it).
CMAKE_BUILD = MAKEFLAGS=--no-print-directory cmake --build
CONFIGURE = cmake -DMPROC_WERROR=$(WERROR) $(CMAKE_FLAGS)

.PHONY: all deps configure build asan-build test test-normal asan demo bench install \
        format clean deb deb-test docs compilers release-test ci python test-python

all: build

deps:
	@scripts/deps

configure: deps
	@$(CONFIGURE) -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

build: configure
	@$(CMAKE_BUILD) $(BUILD) -j $(JOBS)

asan-build: deps
	@$(CONFIGURE) -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug \
	    -DMPROC_SANITIZE=address,undefined -DMPROC_BUILD_EXAMPLES=ON >/dev/null
	@$(CMAKE_BUILD) $(ASAN_BUILD) -j $(JOBS)

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

# Builds only what the demo runs (the library, hogwild and the daemon), with
# the build's output in $(BUILD)/demo-build.log unless it fails.
demo: configure
	@echo "make demo: building hogwild (log: $(BUILD)/demo-build.log)"
	@$(CMAKE_BUILD) $(BUILD) -j $(JOBS) --target hogwild mproc-shm-manager_tool \
	    >$(BUILD)/demo-build.log 2>&1 || \
	    { cat $(BUILD)/demo-build.log; exit 1; }
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
	@if $(PYTHON) -c 'import torch' 2>/dev/null; then $(MAKE) --no-print-directory python && \
	    echo "== python" >&2 && $(PYTHON) bench/python/bench_mp.py --out $(BENCH_OUT)/python.jsonl; fi

# make install PREFIX=/opt/mproc (default: the configured prefix, /usr/local); DESTDIR works.
install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX),)

# Debian packages libmproc0, libmproc-dev and mproc-tools in $(DEB_BUILD)/
# (a Release build for prefix /usr, no tests or examples).
deb: deps
	@$(CONFIGURE) -S . -B $(DEB_BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
	    -DMPROC_BUILD_TESTS=OFF -DMPROC_BUILD_EXAMPLES=OFF $(DEB_FLAGS) >/dev/null
	@$(CMAKE_BUILD) $(DEB_BUILD) -j $(JOBS)
	@cd $(DEB_BUILD) && cpack -G DEB >cpack.log 2>&1 || { cat cpack.log; exit 1; }
	@ls $(DEB_BUILD)/*.deb

# The packages unpacked into a scratch root: the README example builds with
# pkg-config and runs, and the packaged daemon reclaims a killed producer's segment.
deb-test: deb
	@sh tests/build/private_shm.sh sh tests/build/deb_test.sh $(CURDIR) $(CURDIR)/$(DEB_BUILD) cc

# The API reference (Doxygen) in $(BUILD)/docs/html; fails on an undocumented
# public function.
docs: configure
	@$(CMAKE_BUILD) $(BUILD) --target docs

# Release builds with gcc and clang (warnings are errors with WERROR=ON).
compilers: deps
	@for cc in gcc clang; do \
	    echo "== Release build with $$cc"; mkdir -p build-release-$$cc; \
	    $(CONFIGURE) -S . -B build-release-$$cc -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=$$cc \
	        -DCMAKE_CXX_COMPILER=$$(echo $$cc | sed 's/gcc/g++/;s/clang$$/clang++/') \
	        >build-release-$$cc/build.log 2>&1 && \
	    $(CMAKE_BUILD) build-release-$$cc -j $(JOBS) >>build-release-$$cc/build.log 2>&1 || \
	        { cat build-release-$$cc/build.log; exit 1; }; \
	done

# The CTest suite in the gcc Release build (-O3, no -g: backtraces without
# file:line, inlining the other builds do not do).
release-test: compilers
	cd build-release-gcc && ctest --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

# What .ci/run runs: the suite twice, Release builds with gcc and clang (the
# suite a third time in gcc's), the Debian packages and the API reference.
ci: test release-test deb-test docs

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(DEB_BUILD) build-release-gcc build-release-clang \
	    python/build python/mproc/*.so python/mproc/mproc-shm-manager
