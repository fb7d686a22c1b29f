#!/bin/sh
# Kills the parent of examples/producer_consumer (SIGKILL) while its
# producers and consumers run, and checks that they are all gone within
# 3 s: they are mproc processes, which die with their parent (the consumers
# would otherwise wait 60 s on the queue).
# usage: producer_consumer_kill.sh BINARY METHOD
bin=$1 method=$2
fail() { echo "FAIL: $*"; exit 1; }
# A session of its own, so that its processes can be counted by session id
# (forkserver children are the server's, not the parent's).
setsid "$bin" --producers 2 --consumers 2 --count 2000000 --size 4096 \
    --start-method "$method" >/dev/null 2>&1 &
sid=$!
# Without job control a background job is no group leader, so setsid runs
# the program itself: its pid is the session id.
for _ in $(seq 100); do
    [ "$(ps -o sid= -p "$sid" 2>/dev/null | tr -d ' ')" = "$sid" ] &&
        [ "$(ps -o pid= -s "$sid" | wc -l)" -ge 5 ] && break
    sleep 0.1
done
[ "$(ps -o sid= -p "$sid" | tr -d ' ')" = "$sid" ] || fail "producer_consumer did not start"
members=$(ps -o pid= -s "$sid" | wc -l)
echo "session $sid: $members processes running; killing the parent $sid"
[ "$members" -ge 5 ] || fail "want the parent and 4 children, found $members"
kill -KILL "$sid"
for i in $(seq 30); do
    left=$(ps -o pid=,stat= -s "$sid" | awk '$2 !~ /^Z/' | wc -l)
    if [ "$left" -eq 0 ]; then
        echo "all gone after $((i * 100)) ms"
        wait "$sid" 2>/dev/null
        echo PASS
        exit 0
    fi
    sleep 0.1
done
ps -o pid,ppid,stat,args -s "$sid"
fail "processes still running 3 s after their parent was killed"
