#!/bin/sh
# tests/support/unprivileged.sh PROG [ARGS...]: runs PROG as a user who is
# not root, as users run mproc: run by root, as nobody (uid and gid 65534, no
# supplementary groups); run by anyone else, as that user. Exits 77 (skip),
# saying why, when root has no setpriv (util-linux) to drop with, or when
# nobody cannot reach PROG (a checkout under a private folder such as /root).
if [ "$(id -u)" -ne 0 ]; then
  exec "$@"
fi
command -v setpriv >/dev/null 2>&1 || { echo "unprivileged.sh: no setpriv: skipped" >&2; exit 77; }
drop="setpriv --reuid=65534 --regid=65534 --clear-groups"
if ! $drop sh -c 'test -x "$1"' sh "$1"; then
  echo "unprivileged.sh: nobody cannot run $1 (a folder above it is private): skipped" >&2
  exit 77
fi
exec $drop "$@"
