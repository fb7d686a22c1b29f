#!/bin/sh
# Runs examples/spawn_errors in one mode and start method and checks what
# the issue asks: exit status, the record printed, and under 2 s.
# usage: spawn_errors.sh BINARY MODE METHOD
bin=$1 mode=$2 method=$3
start=$(date +%s%N)
out=$("$bin" --mode "$mode" --start-method "$method" 2>&1)
rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "$out"
echo "exit $rc after $ms ms"
fail() { echo "FAIL: $*"; exit 1; }
[ "$ms" -lt 2000 ] || fail "took $ms ms, want < 2000"
case $mode in
ok) [ $rc -eq 0 ] || fail "exit $rc, want 0" ;;
segv)
    [ $rc -eq 1 ] || fail "exit $rc, want 1"
    echo "$out" | grep -q "rank      2" || fail "no rank 2"
    echo "$out" | grep -q "(SIGSEGV)" || fail "no SIGSEGV"
    echo "$out" | grep -q "backtrace:" || fail "no backtrace"
    # symbolized by the parent: the crashing function with file:line first
    # (inlined into worker when optimized); a build without DWARF (Release,
    # no -g) has the name only, worker's when corrupt_batch was inlined
    if readelf -S --wide "$bin" | grep -q ' \.debug_line '; then
        echo "$out" | grep -Eq \
            '^#0  corrupt_batch( \(inlined into worker\))? at .*spawn_errors\.c:[0-9]+ \(spawn_errors\+0x' ||
            fail "frame #0 is not corrupt_batch at spawn_errors.c:N"
    else
        echo "$out" | grep -Eq '^#0  (corrupt_batch|worker) \(spawn_errors\+0x' ||
            fail "frame #0 is not corrupt_batch or worker (a build without DWARF)"
    fi
    [ "$(echo "$out" | grep -c '^#[0-9]')" -ge 3 ] || fail "fewer than 3 backtrace lines" ;;
raise)
    [ $rc -eq 1 ] || fail "exit $rc, want 1"
    echo "$out" | grep -q "rank      2" || fail "no rank 2"
    echo "$out" | grep -q "message   bad batch 7" || fail "no message" ;;
esac
echo PASS
