#!/bin/sh
# The static link line of docs/build.md, exactly:
#   cc app.c $(pkg-config --cflags mproc) $(pkg-config --variable=libdir mproc)/libmproc.a \
#      -pthread -lrt -ldl -lm -ldw
# for the README's example, examples/producer_consumer.c (queues, both
# strategies, which starts the shm-manager daemon) and examples/spawn_errors.c
# (spawn re-executes the program), then runs each. libmproc.a must need no
# other library and no linker flag (no --undefined anchor).
# With MPROC_KINDS_SENDER set (the kinds_sender test helper), also
# tests/build/kinds_receiver.c, which names no queue, lock or CUDA call yet
# must decode a message carrying every object kind that program sends it.
# usage: static_link_test.sh SOURCE_DIR CC PKG_CONFIG_DIR
#        static_link_test.sh SOURCE_DIR CC --build BUILD_DIR CMAKE
# The second form installs BUILD_DIR into a temporary prefix first.
set -eu
src=$1 cc=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mproc-static.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
if [ "$3" = --build ]; then
  "$5" --install "$4" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; fail "cmake --install"; }
  pcdir=$(dirname "$(find "$tmp/prefix" -name mproc.pc)")
else
  pcdir=$3
fi
export PKG_CONFIG_PATH=$pcdir
awk '/^```c$/ { p = 1; next } /^```/ { p = 0 } p' "$src/README.md" >"$tmp/readme.c"
cp "$src/examples/producer_consumer.c" "$src/examples/spawn_errors.c" \
   "$src/tests/build/kinds_receiver.c" "$tmp/"
for app in readme producer_consumer spawn_errors kinds_receiver; do
  (cd "$tmp" && "$cc" $app.c $(pkg-config --cflags mproc) \
     $(pkg-config --variable=libdir mproc)/libmproc.a -pthread -lrt -ldl -lm -ldw -o $app) \
    >"$tmp/$app.log" 2>&1 || { cat "$tmp/$app.log"; fail "$app does not link with the static line"; }
  if readelf -d "$tmp/$app" | grep -q 'NEEDED.*libmproc'; then
    fail "$app links libmproc.so, not libmproc.a"
  fi
done
# file_system starts the prefix's daemon, in a runtime directory of our own
prefix=$(pkg-config --variable=prefix mproc)
export MPROC_SHM_MANAGER=$prefix/libexec/mproc/mproc-shm-manager MPROC_SHM_MANAGER_GRACE=0.3
export MPROC_RUNTIME_DIR=$tmp/rt
mkdir -m 700 "$MPROC_RUNTIME_DIR"
out=$("$tmp/readme") && [ "$out" = "1.0" ] || fail "the README example printed '$out'"
for s in file_descriptor file_system; do
  "$tmp/producer_consumer" --producers 2 --consumers 2 --count 2000 --size 4096 \
    --strategy $s >"$tmp/pc.log" 2>&1 || { cat "$tmp/pc.log"; fail "producer_consumer ($s)"; }
done
"$tmp/spawn_errors" --mode ok --start-method spawn >"$tmp/se.log" 2>&1 ||
  { cat "$tmp/se.log"; fail "spawn_errors (spawn)"; }
if [ -n "${MPROC_KINDS_SENDER:-}" ]; then
  # Only receiving pulls the kinds' code into this program: no queue, lock
  # or CUDA symbol of its own (the object files of those layers come in
  # through the receive path, which registers every kind before decoding).
  if grep -Eq 'mp_(r?lock|semaphore|event|condition|barrier|(simple_|joinable_)?queue|msg_get|[a-z_]*cuda)[a-z_]*\(' \
       "$tmp/kinds_receiver.c"; then
    fail "kinds_receiver names a kind's call itself"
  fi
  "$tmp/kinds_receiver" "$MPROC_KINDS_SENDER" >"$tmp/kr.log" 2>&1 ||
    { cat "$tmp/kr.log"; fail "kinds_receiver"; }
  cat "$tmp/kr.log"
else
  echo "note: MPROC_KINDS_SENDER is not set: the every-kind receive was not run"
fi
echo "ok: the static line links the README example, producer_consumer, spawn_errors and kinds_receiver; they run"
