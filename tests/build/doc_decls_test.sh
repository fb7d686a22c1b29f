#!/bin/sh
# The function declarations the docs show (TYPE mp_name(ARGS); in the ```c
# blocks of README.md and docs/*.md) are the headers' own: each compiles
# beside include/mproc.h and mproc/mpi.h without a conflicting type, and
# each names a function the headers declare. Declarations with "..." (an
# elided argument list) are left out.
# usage: doc_decls_test.sh SOURCE_DIR CC [MARKDOWN...]
#        doc_decls_test.sh --selftest SOURCE_DIR CC
# --selftest checks the check: a page declaring a function with another
# type, and one declaring a function the headers lack, must each fail.
set -eu
if [ "$1" = --selftest ]; then
  src=$2 cc=$3
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/mproc-docdecls.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  printf '```c\nint mp_lock_lock(mp_lock *l, int timeout);\n```\n' >"$tmp/type.md"
  printf '```c\nint mp_lock_frobnicate(mp_lock *l);\n```\n' >"$tmp/name.md"
  for page in type name; do
    if sh "$0" "$src" "$cc" "$tmp/$page.md" >"$tmp/log" 2>&1; then
      cat "$tmp/log"; echo "FAIL: the check passed $page.md"; exit 1
    fi
    grep -q "$page.md" "$tmp/log" || { cat "$tmp/log"; echo "FAIL: $page.md not named"; exit 1; }
  done
  echo "ok: the check fails on a declaration of another type and on an unknown function"
  exit 0
fi
src=$1 cc=$2
shift 2
[ $# -gt 0 ] || set -- "$src/README.md" "$src"/docs/*.md
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mproc-docdecls.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# One declaration a line, whitespace folded, comments dropped, then its page.
awk '
/^```c$/ { inblock = 1; stmt = ""; next }
/^```/ { inblock = 0; next }
!inblock { next }
{
    line = $0
    gsub(/\/\*[^*]*\*\//, "", line)
    stmt = stmt == "" ? line : stmt " " line
    if (line !~ /[;{}][ \t]*$/ && line !~ /^[ \t]*$/)
        next
    s = stmt; stmt = ""
    gsub(/[ \t]+/, " ", s); sub(/^ /, "", s); sub(/ $/, "", s)
    if (s ~ /^(const )?[a-z_][a-z0-9_]*( [a-z_][a-z0-9_]*)*[ *]+mp_[a-z0-9_]+\(.*\);$/ &&
        s !~ /\.\.\./ && s !~ /^(return|if|else|while|for) /)
        printf "%s\t%s\n", s, FILENAME
}' "$@" >"$tmp/decls"
[ -s "$tmp/decls" ] || { echo "FAIL: no declaration found in $*"; exit 1; }
{
  echo '#include <mproc.h>'
  echo '#include <mproc/mpi.h>'
  while IFS='	' read -r decl page; do printf '#line 1 "%s"\n%s\n' "$page" "$decl"; done <"$tmp/decls"
} >"$tmp/decls.c"
"$cc" -std=c11 -fsyntax-only -Werror -I"$src/include" "$tmp/decls.c" ||
  { echo "FAIL: a declaration in the docs does not match the headers' (above)"; exit 1; }
"$cc" -std=c11 -E -I"$src/include" -x c - >"$tmp/headers.i" <<'EOC'
#include <mproc.h>
#include <mproc/mpi.h>
EOC
fail=0
while IFS='	' read -r decl page; do
  name=$(printf '%s\n' "$decl" | sed 's/^[^(]*[ *]\(mp_[a-z0-9_]*\)(.*/\1/')
  grep -q "[ *]$name *(" "$tmp/headers.i" ||
    { echo "FAIL: $page declares $name, which no header declares"; fail=1; }
done <"$tmp/decls"
[ "$fail" -eq 0 ] || exit 1
echo "ok: $(wc -l <"$tmp/decls") declarations in the docs match the headers"
