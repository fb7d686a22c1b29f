#!/usr/bin/env bash
# Runs one MPI test across two hosts made on this machine, and checks its
# outcome as run.sh does on one host:
#   hosts.sh NP ok|fail PATTERN PROGRAM [ARGS...]
# Each host is a set of namespaces kept by one process: its own network
# (one interface, eth0, on a bridge: hosta 10.77.0.2, hostb 10.77.0.3), host
# name, pids, /dev/shm and mproc runtime directory (/tmp/mproc-UID, where
# the shm manager listens: host-local, as /tmp is on a cluster); the rest
# of the file system is shared, as a cluster's shared file system would
# be. Open MPI's mpirun starts from a hostfile, as docs/mpi.md tells a
# cluster's users, and reaches each host through a stand-in for ssh
# (hosts_agent.sh) that enters the host's namespaces.
# Ranks go round-robin (rank 0 on hosta, 1 on hostb, 2 on hosta...): a rank
# and its neighbour are on different hosts. Nothing may be left in either
# host's /dev/shm after the job (no leaked segment on any host).
# Skips (77) unless root, with namespaces and a bridge, and Open MPI.
set -u
np=$1 want=$2 pattern=$3
shift 3
skip() { echo "hosts.sh: skipped: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "making hosts needs root"
launcher=${MPROC_MPIEXEC:-mpirun}
"$launcher" --version 2>&1 | grep -Eq "Open MPI|OpenRTE" || skip "$launcher is not Open MPI's"
for tool in ip unshare nsenter flock; do
    command -v $tool >/dev/null || skip "no $tool (Debian's iproute2, util-linux)"
done
unshare -n -u -m -p --fork --mount-proc --propagation private \
    sh -c 'mount -t tmpfs tmpfs /dev/shm' 2>/dev/null || skip "this machine refuses new namespaces"

# One job at a time on the bridge (ctest serializes MPI tests; this is for
# runs by hand beside it).
exec 9>/tmp/mproc-hosts.lock
flock -w 600 9 || { echo "hosts.sh: another run holds /tmp/mproc-hosts.lock" >&2; exit 1; }
bridge=mprocbr0 dir= runtime=/tmp/mproc-$(id -u)
holders=()
teardown() {
    for p in "${holders[@]}"; do kill -9 "$p" 2>/dev/null; done
    # A host's network outlives its processes while the kernel still holds
    # its sockets (a host taken off the network): unplug it here.
    ip link del mphostap 2>/dev/null
    ip link del mphostbp 2>/dev/null
    ip link del "$bridge" 2>/dev/null
    [ -n "$dir" ] && rm -rf "$dir"
}
trap teardown EXIT
teardown # what a run that was killed left
dir=$(mktemp -d /tmp/mproc-hosts.XXXXXX)
ip link add "$bridge" type bridge && ip addr add 10.77.0.1/24 dev "$bridge" &&
    ip link set "$bridge" up || skip "could not make a bridge"

# A host: namespaces held by a shell that reaps what is left to it (ranks
# whose daemon exited), so no zombie outlives the job inside.
make_host() {
    local name=$1 addr=$2 pid='' i
    unshare -n -u -m -p --fork --mount-proc --propagation private bash -c "
        hostname $name && mount -t tmpfs -o size=2g,mode=1777 tmpfs /dev/shm &&
        mkdir -p $runtime && mount -t tmpfs -o mode=0700 tmpfs $runtime &&
        touch $dir/$name.ready && while :; do sleep 1 & wait \$!; done" 2>"$dir/$name.log" &
    for i in $(seq 100); do
        [ -e "$dir/$name.ready" ] && pid=$(pgrep -P $! -x bash) && break
        sleep 0.05
    done
    if [ -z "$pid" ]; then
        echo "hosts.sh: host $name did not start: $(cat "$dir/$name.log")" >&2
        exit 1
    fi
    holders+=("$pid")
    echo "$pid" >"$dir/$addr.pid"
    ip link add "mp$name" type veth peer name "mp${name}p" &&
        ip link set "mp${name}p" master "$bridge" up &&
        ip link set "mp$name" netns "$pid" &&
        nsenter -t "$pid" -n sh -c "ip link set lo up && ip link set mp$name name eth0 &&
            ip addr add $addr/24 dev eth0 && ip link set eth0 up" ||
        skip "could not give host $name a network interface (veth)"
}
make_host hosta 10.77.0.2
make_host hostb 10.77.0.3
slots=$(((np + 1) / 2))
printf '10.77.0.2 slots=%d\n10.77.0.3 slots=%d\n' "$slots" "$slots" >"$dir/hostfile"

export MPROC_HOSTS_DIR=$dir OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args=(--hostfile "$dir/hostfile" --map-by node -np "$np" --allow-run-as-root
      --mca plm_rsh_agent "$(cd "$(dirname "$0")" && pwd)/hosts_agent.sh"
      --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24
      --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none
      --mca mpi_warn_on_fork 0 --bind-to none
      --mca oob_tcp_keepalive_time 2 --mca oob_tcp_keepalive_intvl 1
      --mca oob_tcp_keepalive_probes 3)
. "$(dirname "$0")/job.sh"
run_job hosts.sh "$want" "$pattern" "$dir/out" "$launcher" "${args[@]}" "$@"
# A killed rank's segments are reclaimed by its host's shm manager after
# its grace period (2 s); give it up to 10 s.
for addr in 10.77.0.2 10.77.0.3; do
    pid=$(cat "$dir/$addr.pid")
    for i in $(seq 100); do
        if ! left=$(nsenter -t "$pid" -m ls -A /dev/shm); then
            echo "hosts.sh: could not look into the /dev/shm of $addr" >&2
            exit 1
        fi
        [ -z "$left" ] && break
        sleep 0.1
    done
    if [ -n "$left" ]; then
        echo "hosts.sh: left in /dev/shm of $addr: $left" >&2
        exit 1
    fi
done
exit 0
