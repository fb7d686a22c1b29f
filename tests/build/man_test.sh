#!/bin/sh
# docs/man/mproc.1 and mproc-shm-manager.8 render with groff without a
# warning, mproc.1 describes every command of `mproc help` and
# mproc-shm-manager.8 every option the daemon's source has.
# usage: man_test.sh SOURCE_DIR
set -eu
src=$1
command -v groff >/dev/null || { echo "skipped: groff not installed (package groff-base)"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
for page in mproc.1 mproc-shm-manager.8; do
  err=$(LC_ALL=C.UTF-8 groff -man -Tutf8 -ww -z "$src/docs/man/$page" 2>&1)
  [ -z "$err" ] || fail "$page: $err"
done
text() { LC_ALL=C.UTF-8 groff -man -Tutf8 "$src/docs/man/$1" 2>/dev/null | sed 's/.\x08//g'; }
for cmd in "shm ls" "shm gc" doctor "shm-manager start" "shm-manager stop" \
           "shm-manager status" version help; do
  text mproc.1 | grep -q -- "$cmd" || fail "mproc.1 does not describe '$cmd'"
done
for opt in --foreground --grace --persistent; do
  grep -q -- "$opt" "$src/tools/shm-manager/main.c" || continue
  text mproc-shm-manager.8 | grep -q -- "$opt" || fail "mproc-shm-manager.8 lacks $opt"
done
echo "ok: the man pages render cleanly and cover the commands and options"
