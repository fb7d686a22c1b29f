# Sourced by run.sh and hosts.sh: run_job NAME WANT PATTERN OUT COMMAND...
# runs the MPI job (COMMAND: the launcher and its arguments) with a 150 s
# limit, its output into the file OUT and to stdout, and checks the
# outcome: WANT ok is exit 0, fail a non-zero exit within the limit;
# PATTERN (an extended regex, "" for none) must be in the output. Exits 1,
# with NAME's sentence, when it is not as wanted; returns 0 when it is.
run_job() {
    local name=$1 want=$2 pattern=$3 out=$4 start=$SECONDS rc
    shift 4
    timeout -k 5 150 "$@" >"$out" 2>&1
    rc=$?
    cat "$out"
    # The launcher passes a rank's death by SIGKILL on as 137: tell a hang by time.
    if [ $((SECONDS - start)) -ge 150 ]; then
        echo "$name: the job hung (killed after 150 s)" >&2
        exit 1
    fi
    if [ "$want" = ok ]; then
        [ $rc -eq 0 ] || { echo "$name: $1 exited $rc, wanted 0" >&2; exit 1; }
    else
        [ $rc -ne 0 ] || { echo "$name: the job exited 0, wanted a failure" >&2; exit 1; }
    fi
    if [ -n "$pattern" ] && ! grep -Eq "$pattern" "$out"; then
        echo "$name: output lacks /$pattern/" >&2
        exit 1
    fi
    return 0
}
