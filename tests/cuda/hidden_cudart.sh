#!/bin/sh
# A CPU-only program runs where the CUDA libraries cannot be found, and a
# CUDA call there says which library it looked for (issue 18). In a private
# mount namespace (unshare -m; needs root or CAP_SYS_ADMIN) an empty file is
# bind-mounted over every libcudart and libcuda file of this machine, so the
# dynamic loader cannot use them; nothing outside the namespace sees it.
#
# usage: hidden_cudart.sh PROBE WANT [PROGRAM...]
# PROBE is tests/cuda/cuda_probe.c (linked with the shared libmproc), which
# must get MP_ENOTSUP naming WANT; each PROGRAM (CPU-only) must exit 0.
# Exit 77 (skipped) when mount namespaces are not permitted here.
set -u
if ! unshare -m --propagation private true 2>/dev/null; then
    echo "skipped: cannot make a mount namespace here (unshare -m needs root or" \
         "CAP_SYS_ADMIN), so the CUDA libraries cannot be hidden"
    exit 77
fi
unset MPROC_CUDART
exec unshare -m --propagation private sh -s "$@" <<'INNER'
set -u
probe=$1 want=$2
shift 2
empty=$(mktemp)
trap 'rm -f "$empty"' EXIT
hidden=0
# Where CUDA installs put them: the toolkit under /usr/local or /opt, the
# distribution's packages and the driver in the library directories.
dirs="/usr/local /opt /usr/lib /usr/lib64 /lib /lib64"
old_ifs=$IFS
IFS=:
for d in ${LD_LIBRARY_PATH:-}; do
    [ -d "$d" ] && dirs="$dirs $d"
done
IFS=$old_ifs
for f in $(find $dirs \( -name 'libcudart.so*' -o -name 'libcuda.so*' \) 2>/dev/null |
           xargs -r readlink -f | sort -u); do
    [ -f "$f" ] || continue
    mount --bind "$empty" "$f" || { echo "FAIL: mount --bind over $f"; exit 1; }
    hidden=$((hidden + 1))
done
echo "hidden: $hidden CUDA library files"
"$probe" "$want" || { echo "FAIL: $probe with the CUDA libraries hidden"; exit 1; }
for p in "$@"; do
    "$p" >/dev/null || { echo "FAIL: $p with the CUDA libraries hidden"; exit 1; }
    echo "ok: $p ran with the CUDA libraries hidden"
done
INNER
