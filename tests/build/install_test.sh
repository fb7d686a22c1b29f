#!/bin/sh
# Installs the build tree into a temporary prefix, then builds and runs a
# small program against the installed copy twice: a C program through
# pkg-config (shared), and a C++ program through a CMake project
# that calls find_package(mproc) and links mproc::mproc. The README's C
# example is built as the README says (cc app.c $(pkg-config ...)) and run.
# It also checks the version in every place: the SONAME is
# libmproc.so.SOVERSION, and pkg-config's version, find_package(mproc
# VERSION EXACT) and mp_version() of the installed library are one.
# usage: install_test.sh SOURCE_DIR BUILD_DIR CC CXX CMAKE SOVERSION
set -eu
src=$1 build=$2 cc=$3 cxx=$4 cmake=$5 sover=$6
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mproc-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" ||
  { cat "$tmp/install.log"; echo "FAIL: cmake --install"; exit 1; }
for f in include/mproc.h include/mproc/error.h; do
  [ -f "$prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
pc=$(find "$prefix" -name mproc.pc)
cfg=$(find "$prefix" -name mprocConfig.cmake)
[ -n "$pc" ] || { echo "FAIL: mproc.pc not installed"; exit 1; }
[ -n "$cfg" ] || { echo "FAIL: mprocConfig.cmake not installed"; exit 1; }
for lib in libmproc.so libmproc.a; do
  [ -n "$(find "$prefix" -name "$lib")" ] || { echo "FAIL: $lib not installed"; exit 1; }
done

# --- SONAME: libmproc.so.MAJOR.MINOR while 0.x (docs/build.md)
so=$(find "$prefix" -name 'libmproc.so.*.*.*' | head -1)
soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libmproc.so.$sover" ] || { echo "FAIL: SONAME '$soname', want libmproc.so.$sover"; exit 1; }
[ -e "$(dirname "$so")/libmproc.so.$sover" ] || { echo "FAIL: no libmproc.so.$sover link"; exit 1; }
readelf -d "$so" | grep -q 'NEEDED.*cud' &&
  { echo "FAIL: the installed libmproc links a CUDA library (it must dlopen it)"; exit 1; }
grep -q -i cuda "$(find "$prefix" -name mproc.pc)" "$(find "$prefix" -name 'mproc*.cmake')" &&
  { echo "FAIL: mproc.pc or the CMake package names CUDA"; exit 1; }

# --- pkg-config
export PKG_CONFIG_PATH="$(dirname "$pc")"
pkg-config --exists mproc || { echo "FAIL: pkg-config does not find mproc"; exit 1; }
ver=$(pkg-config --modversion mproc)
libdir=$(pkg-config --variable=libdir mproc)
"$cc" -std=c11 -pedantic -Wall -Wextra -Werror "$src/tests/build/consumer/main.c" \
  -o "$tmp/app_pc" $(pkg-config --cflags --libs mproc) -Wl,-rpath,"$libdir"
out=$("$tmp/app_pc")
[ "$out" = "mproc $ver" ] || { echo "FAIL: pkg-config app printed '$out'"; exit 1; }
ldd "$tmp/app_pc" | grep -q "$libdir/libmproc.so" ||
  { echo "FAIL: app_pc is not linked to the installed libmproc.so"; ldd "$tmp/app_pc"; exit 1; }
# (the static line: build_static_link, static_link_test.sh)

# --- the README's example, built the way the README says, prints 1.0
awk '/^```c$/ { p = 1; next } /^```/ { p = 0 } p' "$src/README.md" >"$tmp/readme.c"
[ -s "$tmp/readme.c" ] || { echo "FAIL: no C example in README.md"; exit 1; }
"$cc" -Wall -Wextra -Werror "$tmp/readme.c" -o "$tmp/readme" $(pkg-config --cflags --libs mproc) \
  -Wl,-rpath,"$libdir" || { echo "FAIL: the README's example does not build"; exit 1; }
out=$("$tmp/readme")
[ "$out" = "1.0" ] || { echo "FAIL: the README's example printed '$out', not 1.0"; exit 1; }

# --- find_package(mproc) from a C++ project
"$cmake" -S "$src/tests/build/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DMPROC_EXPECT_VERSION="$ver" \
  >"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; echo "FAIL: find_package(mproc)"; exit 1; }
"$cmake" --build "$tmp/consumer" >>"$tmp/consumer.log" 2>&1 ||
  { cat "$tmp/consumer.log"; echo "FAIL: building against mproc::mproc"; exit 1; }
grep -q "mproc_DIR=$prefix" "$tmp/consumer.log" ||
  { cat "$tmp/consumer.log"; echo "FAIL: find_package did not use the installed copy"; exit 1; }
out=$("$tmp/consumer/app_cxx")
[ "$out" = "mproc $ver (C++)" ] || { echo "FAIL: find_package app printed '$out'"; exit 1; }
echo "ok: installed mproc $ver works through pkg-config and find_package; the README example runs"
