#!/bin/bash
# A program's output fits an 80-column terminal: run on a pseudo-terminal
# of 80 columns (script(1), so progress bars draw as for a person), it must
# exit 0 and print no line wider than 80 columns, counting each redraw
# after a carriage return as its own line and no escape sequence.
# usage: output_width.sh PROGRAM [ARG...]
set -u
out=$(mktemp) || exit 1
trap 'rm -f "$out"' EXIT
# No pseudo-terminal to be had (a container without /dev/pts): skipped (77).
script -qec true /dev/null >/dev/null 2>&1 || { echo "SKIP: script(1) gets no pty"; exit 77; }
cmd="stty cols 80 rows 24 && exec $(printf '%q ' "$@")"
script -qec "$cmd" /dev/null >"$out" 2>&1
status=$?
[ "$status" -eq 0 ] || { cat "$out"; echo "FAIL: $* exits $status"; exit 1; }
long=$(tr '\r' '\n' <"$out" | sed 's/\x1b\[[0-9;]*[A-Za-z]//g' | awk 'length($0) > 80')
[ -z "$long" ] || { echo "FAIL: $* prints lines over 80 columns:"; echo "$long"; exit 1; }
echo "ok: $* fits 80 columns ($(wc -l <"$out") lines)"
