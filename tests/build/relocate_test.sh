#!/bin/sh
# An installed mproc stands on its own. Builds mproc from SOURCE_DIR in a
# build tree of its own, stages an install with DESTDIR (prefix /opt/mproc),
# deletes the build tree, moves the staged prefix somewhere else, and then,
# against the moved copy only:
#   - nothing installed names the build tree; the daemon is in libexec/mproc/;
#   - a file_system producer linked with the shared library (pkg-config) and
#     one linked statically (the docs' line, installed in the prefix's bin/)
#     each start the installed daemon, which reclaims their segments after
#     they are SIGKILLed, with nothing said on stderr;
#   - without the daemon, `mproc doctor` fails with the fix, and a producer
#     says "not protected against leaks" exactly once on stderr, or only to
#     its log hook when it set one.
# CTest runs it through private_shm.sh (its own /dev/shm when root).
# usage: relocate_test.sh SOURCE_DIR CC CMAKE
set -eu
src=$1 cc=$2 cmake=$3
unset MPROC_SHM_MANAGER MPROC_RUNTIME_DIR
export MPROC_SHM_MANAGER_GRACE=0.3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mproc-relocate.XXXXXX")
pids=
cleanup() {
  for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
  for rt in "$tmp"/rt-*; do
    [ -d "$rt" ] && MPROC_RUNTIME_DIR=$rt "$tmp/moved/bin/mproc" shm-manager stop >/dev/null 2>&1 || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# --- build, stage, delete the build tree, relocate
"$cmake" -S "$src" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_INSTALL_PREFIX=/opt/mproc -DMPROC_BUILD_TESTS=OFF -DMPROC_BUILD_EXAMPLES=OFF \
  >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "configure"; }
MAKEFLAGS= "$cmake" --build "$tmp/build" -j 2 >>"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log"; fail "build"; }
DESTDIR=$tmp/stage "$cmake" --install "$tmp/build" >>"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log"; fail "install"; }
rm -rf "$tmp/build"
mv "$tmp/stage/opt/mproc" "$tmp/moved"
rm -rf "$tmp/stage"
p=$tmp/moved
daemon=$p/libexec/mproc/mproc-shm-manager
[ -x "$daemon" ] || fail "the daemon is not installed in libexec/mproc/"
[ ! -e "$p/bin/mproc-shm-manager" ] || fail "the daemon is installed in bin/"
[ -x "$p/bin/mproc" ] || fail "the CLI is not installed in bin/"
if grep -rl -F "$tmp/build" "$p" >"$tmp/hits"; then
  cat "$tmp/hits"; fail "installed files name the build tree"
fi

# --- producers against the moved copy
pc=$(find "$p" -name mproc.pc)
export PKG_CONFIG_PATH="$(dirname "$pc")"
libdir=$(pkg-config --variable=libdir mproc)
[ -e "$libdir/libmproc.so" ] || fail "pkg-config libdir $libdir has no libmproc.so"
"$cc" "$src/tests/build/fs_leak.c" -o "$tmp/fs_leak_shared" $(pkg-config --cflags --libs mproc) \
  -Wl,-rpath,"$libdir" || fail "fs_leak does not build against the moved prefix"
# The static line of docs/build.md; the program is installed beside mproc.
"$cc" "$src/tests/build/fs_leak.c" $(pkg-config --cflags mproc) "$libdir/libmproc.a" \
  -pthread -lrt -ldl -lm -ldw -o "$p/bin/fs_leak_static" || fail "fs_leak does not link statically"

segs() { ls /dev/shm 2>/dev/null | grep -c "^mproc-$1-" || true; }

# start EXE NAME: runs a producer in runtime directory rt-NAME until "ready"
start() {
  rt=$tmp/rt-$2
  mkdir -m 700 "$rt"
  : >"$tmp/$2.out"
  MPROC_RUNTIME_DIR=$rt $1 >"$tmp/$2.out" 2>"$tmp/$2.err" &
  pid=$!
  pids="$pids $pid"
  i=0
  until grep -q '^ready' "$tmp/$2.out"; do
    i=$((i + 1))
    [ $i -lt 400 ] && kill -0 $pid 2>/dev/null || { cat "$tmp/$2.err"; fail "$2 did not start"; }
    sleep 0.05
  done
}

# reclaimed EXE NAME: the installed daemon reclaims a killed producer's segments
reclaimed() {
  start "$1" "$2"
  [ "$(segs $pid)" -ge 2 ] || fail "$2: no file_system segments in /dev/shm"
  found=no
  for e in /proc/[0-9]*/exe; do
    [ "$(readlink "$e" 2>/dev/null)" = "$daemon" ] && found=yes && break
  done
  [ $found = yes ] || fail "$2: the installed daemon $daemon is not running"
  kill -9 $pid
  wait $pid 2>/dev/null || true
  i=0
  while [ "$(segs $pid)" -gt 0 ]; do
    i=$((i + 1))
    [ $i -lt 300 ] || fail "$2: the daemon did not reclaim the killed producer's segments in 15 s"
    sleep 0.05
  done
  [ ! -s "$tmp/$2.err" ] || { cat "$tmp/$2.err"; fail "$2 printed on stderr"; }
  echo "ok: $2: the installed daemon reclaimed the killed producer's segments"
}
reclaimed "$tmp/fs_leak_shared" shared
reclaimed "$p/bin/fs_leak_static" static

# --- without the daemon: doctor fails with the fix; the library says so once
mkdir -m 700 "$tmp/rt-doctor"
MPROC_RUNTIME_DIR=$tmp/rt-doctor "$p/bin/mproc" doctor >"$tmp/doctor.ok" 2>&1 || true
grep -q '^\[info\] shm_manager .*starts on demand from '"$daemon" "$tmp/doctor.ok" ||
  { cat "$tmp/doctor.ok"; fail "doctor does not find the installed daemon"; }
mv "$daemon" "$tmp/hidden"
rc=0
MPROC_RUNTIME_DIR=$tmp/rt-doctor "$p/bin/mproc" doctor >"$tmp/doctor.fail" 2>&1 || rc=$?
[ $rc = 1 ] && grep -q '^\[fail\] shm_manager ' "$tmp/doctor.fail" &&
  grep -q 'fix: install mproc-shm-manager where the library looks for it' "$tmp/doctor.fail" ||
  { cat "$tmp/doctor.fail"; fail "doctor (exit $rc) does not fail with the fix without the daemon"; }
start "$tmp/fs_leak_shared" nodaemon
kill -9 $pid
wait $pid 2>/dev/null || true
rm -f /dev/shm/mproc-$pid-*
n=$(grep -c 'mproc: warning: file_system segments are not protected against leaks' \
  "$tmp/nodaemon.err" || true)
[ "$n" = 1 ] || { cat "$tmp/nodaemon.err"; fail "no daemon: said $n times on stderr, not once"; }
grep -q 'libexec/mproc/mproc-shm-manager' "$tmp/nodaemon.err" ||
  { cat "$tmp/nodaemon.err"; fail "the warning does not say where the daemon was looked for"; }
# with a log hook the warning goes there, not to stderr
start "$tmp/fs_leak_shared --hook" hooked
kill -9 $pid
wait $pid 2>/dev/null || true
rm -f /dev/shm/mproc-$pid-*
grep -q '^hook: file_system segments are not protected against leaks' "$tmp/hooked.out" ||
  { cat "$tmp/hooked.out"; fail "no daemon, log hook set: the hook heard nothing"; }
[ ! -s "$tmp/hooked.err" ] || { cat "$tmp/hooked.err"; fail "log hook set, yet stderr was used"; }
mv "$tmp/hidden" "$daemon"
echo "ok: relocated install works without its build tree; doctor and the library report a missing daemon"
