#!/bin/sh
# The Debian packages of `make deb`, unpacked into a scratch root (dpkg -x,
# as apt would place them, without touching the system):
#   - each package holds what it should, with the right dependencies;
#   - the README example builds against the scratch root with pkg-config
#     (cc app.c $(pkg-config --cflags --libs mproc)) and prints 1.0;
#   - the static link line of docs/build.md works with the packaged libmproc.a;
#   - a file_system producer linked with the packaged library starts the
#     packaged daemon (usr/libexec/mproc/, found relative to the library),
#     which reclaims its segments after a SIGKILL;
#   - the packaged `mproc doctor` finds that daemon.
# usage: deb_test.sh SOURCE_DIR DEB_DIR CC
set -eu
src=$1 debs=$2 cc=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mproc-deb.XXXXXX")
pid=
trap '[ -z "$pid" ] || kill -9 $pid 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
root=$tmp/root
ver=
for pkg in libmproc0 libmproc-dev mproc-tools; do
  deb=$(ls "$debs"/${pkg}_*.deb 2>/dev/null | head -1)
  [ -n "$deb" ] || fail "no ${pkg}_*.deb in $debs (make deb)"
  dpkg-deb -f "$deb" Depends >"$tmp/$pkg.depends"
  dpkg-deb -c "$deb" | awk '{ print $6 }' >"$tmp/$pkg.files"
  dpkg -x "$deb" "$root"
  v=$(dpkg-deb -f "$deb" Version)
  [ -z "$ver" ] || [ "$v" = "$ver" ] || fail "$pkg has version $v, libmproc0 $ver"
  ver=$v
done
has() { grep -q "$2" "$tmp/$1.files" || fail "$1 lacks $2"; }
lacks() { ! grep -q "$2" "$tmp/$1.files" || fail "$1 holds $2"; }
has libmproc0 'libmproc\.so\.[0-9]*\.[0-9]*$'
has libmproc0 '/usr/libexec/mproc/mproc-shm-manager$'
lacks libmproc0 'include/'
has libmproc-dev '/usr/include/mproc\.h$'
has libmproc-dev 'libmproc\.a$'
has libmproc-dev 'libmproc\.so$'
has libmproc-dev 'pkgconfig/mproc\.pc$'
has libmproc-dev 'cmake/mproc/mprocConfig\.cmake$'
has mproc-tools '/usr/bin/mproc$'
has mproc-tools 'man1/mproc\.1'
has mproc-tools 'man8/mproc-shm-manager\.8'
grep -q 'libc6' "$tmp/libmproc0.depends" || fail "libmproc0 does not depend on libc6"
grep -q "libmproc0 (= $ver)" "$tmp/libmproc-dev.depends" || fail "libmproc-dev: $(cat "$tmp/libmproc-dev.depends")"
grep -q 'libdlpack-dev' "$tmp/libmproc-dev.depends" || fail "libmproc-dev does not depend on libdlpack-dev"
grep -q "libmproc0 (= $ver)" "$tmp/mproc-tools.depends" || fail "mproc-tools: $(cat "$tmp/mproc-tools.depends")"
so=$(find "$root" -name 'libmproc.so.*.*.*' | head -1)
# Every library libmproc needs (beyond libc) comes from a package that
# libmproc0 depends on (dpkg-shlibdeps through CPack).
for lib in $(readelf -d "$so" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | grep -v '^libc\.so\|^ld-linux'); do
  pkg=$(dpkg -S "*/$lib" 2>/dev/null | head -1 | cut -d: -f1)
  [ -n "$pkg" ] && grep -q "$pkg" "$tmp/libmproc0.depends" ||
    fail "libmproc needs $lib, but libmproc0 does not depend on its package (${pkg:-none})"
done

# --- the README example through pkg-config, against the scratch root
export PKG_CONFIG_PATH="$(dirname "$(find "$root" -name mproc.pc)")"
[ "$(pkg-config --modversion mproc)" = "$ver" ] || fail "mproc.pc version differs from the package's"
libdir=$(pkg-config --variable=libdir mproc)
case $libdir in "$root"/*) ;; *) fail "pkg-config libdir $libdir is outside the scratch root" ;; esac
awk '/^```c$/ { p = 1; next } /^```/ { p = 0 } p' "$src/README.md" >"$tmp/readme.c"
"$cc" "$tmp/readme.c" -o "$tmp/readme" $(pkg-config --cflags --libs mproc) -Wl,-rpath,"$libdir" ||
  fail "the README example does not build against the packages"
out=$("$tmp/readme")
[ "$out" = "1.0" ] || fail "the README example printed '$out'"
ldd "$tmp/readme" | grep -q "$libdir/libmproc.so" || fail "readme is not linked to the packaged library"

# --- the static line, with the packaged libmproc.a
sh "$src/tests/build/static_link_test.sh" "$src" "$cc" "$PKG_CONFIG_PATH"

# --- the packaged daemon reclaims a killed producer's segments
"$cc" "$src/tests/build/fs_leak.c" -o "$tmp/fs_leak" $(pkg-config --cflags --libs mproc) \
  -Wl,-rpath,"$libdir"
mkdir -m 700 "$tmp/rt"
export MPROC_RUNTIME_DIR=$tmp/rt MPROC_SHM_MANAGER_GRACE=0.3
unset MPROC_SHM_MANAGER
: >"$tmp/out"
"$tmp/fs_leak" >"$tmp/out" 2>"$tmp/err" &
pid=$!
i=0
until grep -q '^ready' "$tmp/out"; do
  i=$((i + 1)); [ $i -lt 400 ] && kill -0 $pid 2>/dev/null || { cat "$tmp/err"; fail "fs_leak"; }
  sleep 0.05
done
[ ! -s "$tmp/err" ] || { cat "$tmp/err"; fail "fs_leak printed on stderr (no daemon?)"; }
found=no
for e in /proc/[0-9]*/exe; do
  [ "$(readlink "$e" 2>/dev/null)" = "$root/usr/libexec/mproc/mproc-shm-manager" ] && found=yes
done
[ $found = yes ] || fail "the packaged daemon is not running"
ls /dev/shm | grep -q "^mproc-$pid-" || fail "fs_leak made no file_system segment"
kill -9 $pid; wait $pid 2>/dev/null || true
i=0
while ls /dev/shm | grep -q "^mproc-$pid-"; do
  i=$((i + 1)); [ $i -lt 300 ] || fail "the packaged daemon did not reclaim the segments"
  sleep 0.05
done
pid=
mkdir -m 700 "$tmp/rt2"
MPROC_RUNTIME_DIR=$tmp/rt2 "$root/usr/bin/mproc" doctor >"$tmp/doctor" 2>&1 || true
grep -q "shm_manager .*$root/usr/libexec/mproc/mproc-shm-manager" "$tmp/doctor" ||
  { cat "$tmp/doctor"; fail "the packaged mproc doctor does not find the packaged daemon"; }
echo "ok: libmproc0, libmproc-dev, mproc-tools $ver: contents and dependencies right; the README"
echo "    example builds with pkg-config; the static line links; the packaged daemon reclaims"
