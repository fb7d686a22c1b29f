#!/bin/sh
# add_subdirectory(mproc) from another project (tests/build/subproject/):
# configures and builds it, then checks that mproc registered no tests and
# built no examples there, that the parent's own target got none of mproc's
# flags, that the daemon sits beside the library (where the not-installed
# library finds it), and that the parent's programs run: one prints the
# version (mp_version() equals MP_VERSION_STRING) linked with mproc::mproc,
# another with mproc::mproc_static, and one linked with mproc::mproc creates
# file_system tensors: the daemon beside the library starts and reclaims them
# after a SIGKILL.
# usage: subproject_test.sh SOURCE_DIR CC CMAKE
set -eu
src=$1 cc=$2 cmake=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mproc-subproject.XXXXXX")
pid=
trap '[ -z "$pid" ] || kill -9 $pid 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
b=$tmp/b
"$cmake" -S "$src/tests/build/subproject" -B "$b" -DMPROC_SOURCE_DIR="$src" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Release >"$tmp/log" 2>&1 ||
  { cat "$tmp/log"; fail "configure"; }
MAKEFLAGS= "$cmake" --build "$b" -j 2 --target parent_app parent_app_static parent_fs \
  mproc-shm-manager_tool >>"$tmp/log" 2>&1 || { cat "$tmp/log"; fail "build"; }
(cd "$b" && ctest -N) >"$tmp/ctest" 2>&1 || true
grep -q 'Total Tests: 0' "$tmp/ctest" || { cat "$tmp/ctest"; fail "mproc registered tests in a parent project"; }
grep -q 'hogwild\|bench_all' "$b/Makefile" "$b/mproc/Makefile" && fail "mproc added its examples to a parent project"
if grep -q 'Wextra\|Werror' "$b/parent_opts.txt"; then
  fail "mproc's warning flags reached the parent's target: $(cat "$b/parent_opts.txt")"
fi
lib=$(find "$b" -name 'libmproc.so.*.*.*' | head -1)
[ -n "$lib" ] && [ -x "$(dirname "$lib")/mproc-shm-manager" ] ||
  fail "the daemon is not beside the library in the parent's build"
app=$(find "$b" -name parent_app -type f | head -1)
out=$("$app") || fail "parent_app failed"
case $out in "mproc "*) ;; *) fail "parent_app printed '$out'" ;; esac
[ "$("$(find "$b" -name parent_app_static -type f | head -1)")" = "$out" ] || fail "parent_app_static"
mkdir -m 700 "$tmp/rt"
: >"$tmp/out"
MPROC_RUNTIME_DIR=$tmp/rt MPROC_SHM_MANAGER_GRACE=0.3 "$(find "$b" -name parent_fs -type f | head -1)" \
  >"$tmp/out" 2>"$tmp/err" &
pid=$!
i=0
until grep -q '^ready' "$tmp/out"; do
  i=$((i + 1)); [ $i -lt 400 ] && kill -0 $pid 2>/dev/null || { cat "$tmp/err"; fail "parent_fs"; }
  sleep 0.05
done
kill -9 $pid; wait $pid 2>/dev/null || true
[ ! -s "$tmp/err" ] || { cat "$tmp/err"; fail "parent_fs printed on stderr (no daemon?)"; }
i=0
while ls /dev/shm | grep -q "^mproc-$pid-"; do
  i=$((i + 1)); [ $i -lt 300 ] || fail "the daemon did not reclaim parent_fs's segments"
  sleep 0.05
done
pid=
echo "ok: add_subdirectory(mproc) builds the library and daemon, no tests or examples; $out"
