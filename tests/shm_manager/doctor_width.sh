#!/bin/sh
# `mproc doctor` on a terminal of 60 and 80 columns: no line reaches the
# width (so none wraps), and the text is all there (the fix line still shows).
# Off a terminal it prints one line per check, for scripts.
# usage: doctor_width.sh MPROC
set -u
mproc=$1
command -v script >/dev/null || { echo "skipped: no script(1) to make a terminal"; exit 77; }
# A runtime directory of its own, so no daemon of another test answers, and
# no daemon: a warning with a fix line.
MPROC_RUNTIME_DIR=$(mktemp -d) || exit 1
trap 'rm -rf "$MPROC_RUNTIME_DIR"' EXIT
export MPROC_RUNTIME_DIR MPROC_SHM_MANAGER=none
for cols in 60 80; do
    out=$(script -qec "stty cols $cols; '$mproc' doctor" /dev/null | tr -d '\r')
    long=$(printf '%s\n' "$out" | awk -v w="$cols" 'length($0) >= w')
    [ -z "$long" ] || { echo "FAIL: lines of $cols columns or more at width $cols:"; echo "$long"; exit 1; }
    printf '%s\n' "$out" | grep -q 'fix: unset MPROC_SHM_MANAGER' ||
        { echo "FAIL: the fix line is missing at width $cols:"; echo "$out"; exit 1; }
    echo "ok: width $cols"
done
n=$("$mproc" doctor | grep -c 'unset MPROC_SHM_MANAGER to turn leak protection back on')
[ "$n" = 1 ] || { echo "FAIL: off a terminal the fix is not on one line"; exit 1; }
echo "ok: one line per check off a terminal"
