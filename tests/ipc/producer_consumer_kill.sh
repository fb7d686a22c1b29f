#!/bin/sh
# Kills the parent of examples/producer_consumer (SIGKILL) while its
# producers and consumers run, and checks that they are all gone within
# 3 s: they are mproc processes, which die with their parent (the consumers
# would otherwise wait 60 s on the queue).
# usage: producer_consumer_kill.sh BINARY METHOD
bin=$1 method=$2
fail() { echo "FAIL: $*"; exit 1; }
# Live (not zombie) processes of session $1, read from /proc (no procps).
members() {
    n=0
    for f in /proc/[0-9]*/stat; do
        line=$(cat "$f" 2>/dev/null) || continue
        rest=${line##*) }
        # shellcheck disable=SC2086
        set -- $rest
        [ "$4" = "$sid" ] && [ "$1" != Z ] && n=$((n + 1))
    done
    echo "$n"
}
# A session of its own, so that its processes can be counted by session id
# (forkserver children are re-parented, the server is a child too). Without
# job control a background job is no group leader, so setsid runs the
# program itself: its pid is the session id.
setsid "$bin" --producers 2 --consumers 2 --count 2000000 --size 4096 \
    --start-method "$method" >/dev/null 2>&1 &
sid=$!
count=0
for _ in $(seq 100); do
    count=$(members)
    [ "$count" -ge 5 ] && break
    sleep 0.1
done
echo "session $sid: $count processes running; killing the parent $sid"
[ "$count" -ge 5 ] || fail "want the parent and 4 children, found $count"
kill -KILL "$sid"
for i in $(seq 30); do
    if [ "$(members)" -eq 0 ]; then
        echo "all gone after $((i * 100)) ms"
        wait "$sid" 2>/dev/null
        echo PASS
        exit 0
    fi
    sleep 0.1
done
fail "$(members) processes still running 3 s after their parent was killed"
