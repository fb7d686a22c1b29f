#!/usr/bin/env bash
# Runs one MPI test under mpirun on this machine and checks its outcome.
#   run.sh NP shm|tcp ok|fail PATTERN PROGRAM [ARGS...]
# shm: the same-host shared-memory path (Open MPI's default transports);
# tcp: that path forced off (MPROC_MPI_LOCAL=0) and Open MPI on TCP only, as
# between hosts. ok: exit 0 wanted; fail: a non-zero exit within the time
# limit, with PATTERN (an extended regex, "" for none) in the output.
set -u
np=$1 variant=$2 want=$3 pattern=$4
shift 4
# mpi_warn_on_fork 0: mproc forks worker processes (they never call MPI).
args=(--oversubscribe -np "$np" --mca btl_vader_single_copy_mechanism none --mca mpi_warn_on_fork 0)
[ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
if [ "$variant" = tcp ]; then
    args+=(--mca btl self,tcp -x MPROC_MPI_LOCAL=0)
else
    args+=(-x MPROC_MPI_LOCAL=1)
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$SECONDS
timeout -k 5 150 mpirun "${args[@]}" "$@" >"$out" 2>&1
rc=$?
cat "$out"
# mpirun passes a rank's death by SIGKILL on as 137: tell a hang by time.
if [ $((SECONDS - start)) -ge 150 ]; then
    echo "run.sh: the job hung (killed after 150 s)" >&2
    exit 1
fi
if [ "$want" = ok ]; then
    [ $rc -eq 0 ] || { echo "run.sh: mpirun exited $rc, wanted 0" >&2; exit 1; }
else
    [ $rc -ne 0 ] || { echo "run.sh: the job exited 0, wanted a failure" >&2; exit 1; }
fi
if [ -n "$pattern" ] && ! grep -Eq "$pattern" "$out"; then
    echo "run.sh: output lacks /$pattern/" >&2
    exit 1
fi
exit 0
