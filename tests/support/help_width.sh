#!/bin/sh
# Every program a user runs prints its --help within 80 columns, exits 0
# and says "usage:"; for mproc, `mproc help COMMAND` too, for each command
# its own help lists. (Error sentences are left to the terminal to wrap.)
# usage: help_width.sh PROGRAM...
set -u
fail=0
tmp=$(mktemp) || exit 1
trap 'rm -f "$tmp"' EXIT
check() { # check LABEL COMMAND...
    label=$1
    shift
    out=$("$@" 2>&1) || { echo "FAIL: $label exits $?"; fail=1; return; }
    printf '%s\n' "$out" | grep -q 'usage:' ||
        { echo "FAIL: $label says no usage:"; fail=1; return; }
    long=$(printf '%s\n' "$out" | awk 'length($0) > 80')
    [ -z "$long" ] ||
        { echo "FAIL: $label has lines over 80 columns:"; echo "$long"; fail=1; return; }
    echo "ok: $label"
}
for prog in "$@"; do
    # As a user types it from the build folder: ./NAME (usage lines name argv[0]).
    dir=$(dirname "$prog") name=$(basename "$prog")
    check "$name --help" sh -c 'cd "$1" && exec "./$2" --help' sh "$dir" "$name"
    if [ "$name" = mproc ]; then
        # The command column of `mproc help` ("shm ls", "doctor", ...).
        "$prog" help | sed -n 's/^  \([a-z][a-z-]*\( [a-z]*\)\{0,1\}\) .*/\1/p' |
            sed 's/ start|stop|status//; s/ \[command\]//' >"$tmp"
        [ -s "$tmp" ] || { echo "FAIL: mproc help lists no command"; fail=1; }
        while read -r c; do
            # shellcheck disable=SC2086  # "shm ls" is two words on purpose
            check "mproc help $c" "$prog" help $c
        done <"$tmp"
    fi
done
exit $fail
