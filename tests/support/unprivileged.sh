#!/bin/sh
# tests/support/unprivileged.sh PROG [ARGS...]: runs PROG as a user who is
# not root, as users run mproc: run by root, as nobody (uid and gid 65534, no
# supplementary groups); run by anyone else, as that user. Exits 77 (skip)
# when root has no setpriv (util-linux) to drop with.
if [ "$(id -u)" -ne 0 ]; then
  exec "$@"
fi
command -v setpriv >/dev/null 2>&1 || { echo "unprivileged.sh: no setpriv: skipped" >&2; exit 77; }
exec setpriv --reuid=65534 --regid=65534 --clear-groups "$@"
