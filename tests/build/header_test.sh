#!/bin/sh
# include/mproc.h must compile alone: as strict ISO C11 (no GNU extensions,
# -pedantic) and as C++17 (its declarations inside extern "C"). Each area
# header must also compile alone, so users can include just one.
# usage: header_test.sh SOURCE_DIR CC CXX
set -eu
src=$1 cc=$2 cxx=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mproc-header.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
warn="-pedantic -Wall -Wextra -Werror"

check() { # header
  printf '#include "%s"\nint main(void) { return 0; }\n' "$1" >"$tmp/t.c"
  "$cc" -std=c11 $warn -I"$src/include" -c "$tmp/t.c" -o "$tmp/t.o" ||
    { echo "FAIL: $1 does not compile alone as C11 (-pedantic -Werror)"; exit 1; }
  cp "$tmp/t.c" "$tmp/t.cpp"
  "$cxx" -std=c++17 $warn -I"$src/include" -c "$tmp/t.cpp" -o "$tmp/t.o" ||
    { echo "FAIL: $1 does not compile as C++17"; exit 1; }
}
check mproc.h
for h in "$src"/include/mproc/*.h; do
  check "mproc/$(basename "$h")"
done

# C++ must see C linkage: the mangled name of a function declared outside
# extern "C" would be _Z10mp_versionv, not mp_version.
cat >"$tmp/link.cpp" <<'CPP'
#include "mproc.h"
const char *(*volatile fn)(void) = &mp_version;
CPP
"$cxx" -std=c++17 $warn -I"$src/include" -c "$tmp/link.cpp" -o "$tmp/link.o"
if ! nm "$tmp/link.o" | grep -q ' U mp_version$'; then
  echo "FAIL: mproc.h does not give mp_version C linkage in C++"
  nm "$tmp/link.o"
  exit 1
fi
echo "ok: mproc.h and every mproc/*.h compile alone as C11 and C++17"
