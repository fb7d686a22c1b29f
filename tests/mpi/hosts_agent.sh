#!/usr/bin/env bash
# Open MPI's ssh for the hosts of hosts.sh: hosts_agent.sh [OPTIONS] HOST
# COMMAND... runs the command as ssh would, by the shell, on the host: in
# the namespaces of the process whose pid $MPROC_HOSTS_DIR/HOST.pid holds.
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
host=$1
shift
pid=$(cat "$MPROC_HOSTS_DIR/$host.pid") || exit 255
exec nsenter -t "$pid" -n -u -m -p /bin/sh -c "$*"
