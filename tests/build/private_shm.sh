#!/bin/sh
# Runs a command in a private mount namespace with its own /dev/shm (a fresh
# tmpfs) when it can (root, unshare from util-linux), else as it is. The
# build tests start their own shm-manager daemons, which adopt and may
# reclaim every dead process's mproc segment they see in /dev/shm; in a
# namespace they see only their own test's.
# usage: private_shm.sh COMMAND [ARG]...
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && unshare -m true 2>/dev/null; then
  exec unshare -m sh -c 'mount --make-rprivate / && mount -t tmpfs -o mode=1777,size=512m tmpfs /dev/shm && exec "$@"' sh "$@"
fi
exec "$@"
