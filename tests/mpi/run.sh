#!/usr/bin/env bash
# Runs one MPI test on this machine and checks its outcome.
#   run.sh NP shm|tcp|hosts ok|fail PATTERN PROGRAM [ARGS...]
# The launcher is $MPROC_MPIEXEC (CTest sets the one of the MPI the program
# was built with; default mpirun); Open MPI's and MPICH's are told apart by
# their --version.
# shm: the same-host shared-memory path (the MPI's default transports);
# tcp: that path forced off (MPROC_MPI_LOCAL=0) and the MPI on TCP only, as
# between hosts; hosts: across two hosts made on this machine (hosts.sh,
# Open MPI only). ok: exit 0 wanted; fail: a non-zero exit within the time
# limit, with PATTERN (an extended regex, "" for none) in the output.
set -u
np=$1 variant=$2 want=$3 pattern=$4
shift 4
[ "$variant" = hosts ] && exec "$(dirname "$0")/hosts.sh" "$np" "$want" "$pattern" "$@"
launcher=${MPROC_MPIEXEC:-mpirun}
if [ "$variant" = tcp ]; then
    export MPROC_MPI_LOCAL=0
else
    export MPROC_MPI_LOCAL=1
fi
if "$launcher" --version 2>&1 | grep -q HYDRA; then
    # MPICH (hydra): runs as root and oversubscribes without flags, and
    # passes the whole environment on. NOLOCAL makes every rank its own node
    # (no MPICH shared memory, MPI_COMM_TYPE_SHARED of one rank each), the
    # closest to separate hosts. UCX's TCP transport (UCX_TLS=tcp,self) is
    # not forced: with Debian's MPICH 4.0.2 and UCX 1.13.1 a plain MPI
    # all-to-all of 100 kB between 4 ranks of one host hangs in
    # MPI_Finalize there (docs/mpi.md).
    args=(-n "$np")
    [ "$variant" = tcp ] && export MPIR_CVAR_NOLOCAL=1
else
    # Open MPI. mpi_warn_on_fork 0: mproc forks worker processes (they never
    # call MPI).
    args=(--oversubscribe -np "$np" --mca btl_vader_single_copy_mechanism none
          --mca mpi_warn_on_fork 0 -x MPROC_MPI_LOCAL)
    [ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_rmaps_base_oversubscribe=1
    [ "$variant" = tcp ] && args+=(--mca btl "self,tcp")
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
. "$(dirname "$0")/job.sh"
run_job run.sh "$want" "$pattern" "$out" "$launcher" "${args[@]}" "$@"
