#!/bin/sh
# Generates the API reference with Doxygen (the Doxyfile configured from
# cmake/Doxyfile.in) into OUT and fails when a public function has no doc
# comment: Doxygen's "is not documented" warning for a function, which it
# gives for any declaration in include/ with no comment above it in its block
# (see cmake/doxygen-filter.awk). Also fails when Doxygen itself fails or
# writes no index.html.
# usage: apidoc_test.sh DOXYGEN DOXYFILE OUT [INPUT_DIR]
#        apidoc_test.sh --selftest DOXYGEN DOXYFILE SOURCE_DIR
# --selftest checks the check: a copy of include/ plus a header with one
# undocumented function must fail, naming that function.
set -eu
if [ "$1" = --selftest ]; then
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/mproc-apidoc.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  cp -r "$4/include" "$tmp/include"
  printf '/* A probe. */\n#include <stddef.h>\n\n/* Documented. */\nint mp_probe_ok(void);\n\nint mp_probe_undocumented(void);\n' \
    >"$tmp/include/mproc/probe.h"
  if sh "$0" "$2" "$3" "$tmp/out" "$tmp/include" >"$tmp/log" 2>&1; then
    cat "$tmp/log"; echo "FAIL: the check passed a header with an undocumented function"; exit 1
  fi
  grep -q 'mp_probe_undocumented' "$tmp/log" && ! grep -q 'mp_probe_ok' "$tmp/log" ||
    { cat "$tmp/log"; echo "FAIL: the check did not name exactly the undocumented function"; exit 1; }
  echo "ok: the doc check fails on an undocumented public function and names it"
  exit 0
fi
doxygen=$1 doxyfile=$2 out=$3 input=${4:-}
mkdir -p "$out"
log=$out/doxygen-warnings.txt
{ cat "$doxyfile"; echo "OUTPUT_DIRECTORY = $out"; echo "WARN_LOGFILE = $log"
  [ -z "$input" ] || { echo "INPUT = $input"; echo "STRIP_FROM_PATH = $input"; }; } |
  "$doxygen" - >"$out/doxygen.log" 2>&1 || { cat "$out/doxygen.log"; echo "FAIL: doxygen"; exit 1; }
[ -s "$out/html/index.html" ] || { echo "FAIL: doxygen wrote no $out/html/index.html"; exit 1; }
missing=$(grep '(function) .* is not documented' "$log" || true)
if [ -n "$missing" ]; then
  echo "FAIL: public functions without a doc comment (add a comment above each in include/):"
  echo "$missing" | sed 's/ warning: Member / /; s/ (function) of file .*//'
  exit 1
fi
n=$(grep -c 'class="memname"' "$out"/html/*_8h.html | awk -F: '{ s += $2 } END { print s }')
echo "ok: API reference in $out/html/index.html ($n documented members); every public function has a doc comment"
