#!/bin/bash
# A small cluster on this machine: N nodes as Linux network + UTS namespaces, OpenMPI able to start ranks on
# them, and a real Slurm (slurmctld on node1, one slurmd per node). For tests and for trying the cluster
# scripts before a real cluster. Needs root, iproute2, util-linux; Slurm needs Debian's slurm-wlm and munge.
#
#   scripts/dev/cluster.sh up 2          # node1, node2 at 10.77.0.11, 10.77.0.12 on bridge ttc-br
#   scripts/dev/cluster.sh exec node1 sbatch scripts/slurm/torus_train.sbatch ...   # a shell "on" node1
#   scripts/dev/cluster.sh status        # nodes, daemons, sinfo
#   scripts/dev/cluster.sh down          # everything gone: daemons, processes in the nodes, namespaces, bridge
#
# Each node: network namespace ttc-nodeI (loopback up, eth0 = one end of a veth pair whose other end sits on
# the bridge ttc-br, 10.77.0.(10+I)/24, no default route: nothing can leave the machine; the bridge has no
# address, so the host itself cannot reach the nodes either), /etc/netns/ttc-nodeI/hosts naming every node
# (`ip netns exec` binds it over /etc/hosts), and hostname nodeI in a UTS namespace made at every entry.
# `exec NODE CMD` enters a node with $STATE/env sourced: SLURM_CONF, the mpirun rsh agent ($STATE/rsh-agent,
# which enters the named node instead of ssh), run-as-root permission and the interface OpenMPI should use.
# Options (environment): TTC_STATE (default /run/torus-cluster), TTC_NET (default 10.77.0), TTC_CPUS (CPUs
# declared per node, default 4), TTC_SLURM=0 (namespaces and mpirun only), TTC_RATE (for example 1gbit: a
# token-bucket limit on each node's outgoing link, `tc qdisc ... tbf`, so that traffic between nodes is slower
# than traffic inside one, as on a real cluster; TTC_BURST its bucket, default 256kb; this kernel has no netem,
# so no added latency).
set -euo pipefail

STATE=${TTC_STATE:-/run/torus-cluster}
NET=${TTC_NET:-10.77.0}
CPUS=${TTC_CPUS:-4}
RATE=${TTC_RATE:-}
BURST=${TTC_BURST:-256kb}
BR=ttc-br
NS=ttc-node
SLURM_BIN=${TTC_SLURM_BIN:-/usr/sbin}
WAIT=30        # seconds the daemons get to come up / go down

die() { echo "cluster.sh: $*" >&2; exit 1; }
nodes() { [[ -f $STATE/nodes ]] && cat "$STATE/nodes" || true; }
# enter NODE CMD...: the node's network namespace, then new UTS and mount namespaces where the hostname is
# NODE and the node's hosts file is bound over /etc/hosts (private propagation: the host's /etc/hosts is
# untouched). Unlike `ip netns exec` this keeps the host's /sys, so slurmd finds /sys/fs/cgroup.
ENTER='mount --bind "/etc/netns/$1/hosts" /etc/hosts && hostname "$0" && shift && exec "$@"'
enter() {
    local node=$1; shift
    nsenter --net="/run/netns/$NS${node#node}" unshare --uts --mount /bin/sh -c "$ENTER" "$node" "$NS${node#node}" "$@"
}

up() {
    local n=${1:?usage: cluster.sh up N}
    [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 32 ]] || die "up N: N must be 1..32, got '$n'"
    [[ $(id -u) == 0 ]] || die "needs root (network namespaces)"
    [[ -e $STATE/nodes ]] && die "a cluster is up already ($STATE); run 'cluster.sh down' first"
    command -v ip >/dev/null && command -v unshare >/dev/null || die "needs iproute2 (ip) and util-linux (unshare)"
    trap 'echo "cluster.sh: up failed; tearing down" >&2; down >/dev/null 2>&1 || true' EXIT
    mkdir -p "$STATE"/{log,slurm/state} && chmod 700 "$STATE"
    : > "$STATE/nodes"

    ip link add "$BR" type bridge && ip link set "$BR" up
    local hosts="127.0.0.1 localhost\n"
    for i in $(seq 1 "$n"); do hosts+="$NET.$((10 + i)) node$i\n"; done
    for i in $(seq 1 "$n"); do
        ip netns add "$NS$i"
        ip link add "ttc-v$i" type veth peer name eth0 netns "$NS$i"
        ip link set "ttc-v$i" master "$BR" up
        ip -n "$NS$i" link set lo up
        ip -n "$NS$i" addr add "$NET.$((10 + i))/24" dev eth0
        ip -n "$NS$i" link set eth0 up
        if [[ -n $RATE ]]; then  # what leaves a node is shaped; ranks inside a node talk through memory
            ip netns exec "$NS$i" tc qdisc add dev eth0 root tbf rate "$RATE" burst "$BURST" latency 100ms \
                || die "tc tbf rate $RATE on node$i failed (a rate such as 1gbit or 500mbit)"
        fi
        mkdir -p "/etc/netns/$NS$i" && printf "$hosts" > "/etc/netns/$NS$i/hosts"
        echo "node$i" >> "$STATE/nodes"
    done

    # mpirun's remote shell: "AGENT HOST COMMAND..." runs COMMAND (a shell line, as over ssh) inside HOST
    cat > "$STATE/rsh-agent" <<EOF
#!/bin/sh
# OpenMPI rsh agent for the namespace cluster: enter node HOST and run the command line there.
host=\$1; shift
exec nsenter --net="/run/netns/$NS\${host#node}" unshare --uts --mount /bin/sh -c \\
    'mount --bind "/etc/netns/\$1/hosts" /etc/hosts && hostname "\$0" && exec /bin/sh -c "\$2"' \\
    "\$host" "$NS\${host#node}" "\$*"
EOF
    chmod 755 "$STATE/rsh-agent"
    cat > "$STATE/env" <<EOF
export SLURM_CONF=$STATE/slurm/slurm.conf
export OMPI_MCA_plm_rsh_agent=$STATE/rsh-agent PRTE_MCA_plm_ssh_agent=$STATE/rsh-agent
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PRTE_MCA_oob_tcp_if_include=$NET.0/24 OMPI_MCA_oob_tcp_if_include=$NET.0/24
export OMPI_MCA_btl_tcp_if_include=$NET.0/24
export TTC_STATE=$STATE
EOF
    # names: every node resolves itself and its neighbour to the bridge addresses
    for i in $(seq 1 "$n"); do
        enter "node$i" getent hosts "node$i" | grep -q "^$NET.$((10 + i)) " || die "node$i does not resolve itself"
        enter "node$i" getent hosts "node$(( i % n + 1 ))" >/dev/null || die "node$i cannot resolve its neighbour"
    done

    if [[ ${TTC_SLURM:-1} != 0 ]]; then slurm_up "$n"; fi
    trap - EXIT
    status
}

slurm_up() {
    local n=$1
    command -v munged >/dev/null && [[ -x $SLURM_BIN/slurmctld ]] \
        || die "Slurm needs Debian's packages: apt-get install slurm-wlm munge (or TTC_SLURM=0 for mpirun only)"
    mkdir -p "$STATE/munge" && chmod 700 "$STATE/munge"
    head -c 1024 /dev/urandom > "$STATE/munge/munge.key" && chmod 400 "$STATE/munge/munge.key"
    munged --force --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.socket" \
        --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/log/munged.log" \
        --seed-file="$STATE/munge/munge.seed" 2>>"$STATE/log/munged.log"
    local nodelines="" i
    for i in $(seq 1 "$n"); do
        nodelines+="NodeName=node$i NodeHostname=node$i NodeAddr=$NET.$((10 + i)) CPUs=$CPUS RealMemory=2000 State=UNKNOWN"$'\n'
    done
    cat > "$STATE/slurm/slurm.conf" <<EOF
# written by scripts/dev/cluster.sh: slurmctld on node1, one slurmd per namespace node
ClusterName=ttc
SlurmctldHost=node1($NET.11)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$STATE/slurm/state
SlurmdSpoolDir=$STATE/slurm/spool-%n
SlurmctldPidFile=$STATE/slurm/slurmctld.pid
SlurmdPidFile=$STATE/slurm/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
# no cgroups in these namespaces: processes tracked by parent pid, no task binding (2 real cores)
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# declare more CPUs per node than the machine has
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SlurmdTimeout=300
InactiveLimit=0
KillWait=5
MinJobAge=300
$nodelines
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    # daemons in the foreground (-D), detached from this shell; their pids are in the pid files
    setsid nohup "$0" _enter node1 "$SLURM_BIN/slurmctld" -D -i -f "$STATE/slurm/slurm.conf" \
        >>"$STATE/log/slurmctld.out" 2>&1 < /dev/null &
    for i in $(seq 1 "$n"); do
        setsid nohup "$0" _enter "node$i" "$SLURM_BIN/slurmd" -D -f "$STATE/slurm/slurm.conf" -N "node$i" \
            >>"$STATE/log/slurmd-node$i.out" 2>&1 < /dev/null &
    done
    local t
    for t in $(seq 1 $WAIT); do
        if enter node1 env SLURM_CONF="$STATE/slurm/slurm.conf" "$SLURM_BIN/../bin/sinfo" -h -N -o '%N %t' \
            2>/dev/null | awk '$2 ~ /^(idle|mix|alloc)/' | wc -l | grep -qx "$n"; then return 0; fi
        sleep 1
    done
    tail -n 5 "$STATE"/log/slurm*.log >&2 || true
    die "Slurm did not show $n idle nodes within ${WAIT}s (logs in $STATE/log)"
}

kill_pidfile() {  # kill_pidfile FILE...: TERM, wait up to WAIT/3 s, then KILL
    local f pid t
    for f in "$@"; do
        [[ -f $f ]] || continue
        pid=$(cat "$f" 2>/dev/null || true)
        [[ $pid =~ ^[0-9]+$ ]] || continue
        kill -TERM "$pid" 2>/dev/null || continue
        for t in $(seq 1 $(( WAIT * 3 ))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
}

down() {
    local node i pids t
    kill_pidfile "$STATE"/slurm/slurmd-*.pid "$STATE/slurm/slurmctld.pid"
    # whatever still runs inside the nodes (job steps, ranks, orted) was started through this cluster
    for t in 1 2; do
        for node in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$NS[0-9]*$" || true); do
            pids=$(ip netns pids "$node" 2>/dev/null || true)
            [[ -n $pids ]] && kill -"$([[ $t == 1 ]] && echo TERM || echo KILL)" $pids 2>/dev/null || true
        done
        [[ $t == 1 ]] && sleep 1
    done
    kill_pidfile "$STATE/munge/munged.pid"
    for node in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$NS[0-9]*$" || true); do
        ip netns del "$node" 2>/dev/null || true
        rm -rf "/etc/netns/$node"
    done
    ip link del "$BR" 2>/dev/null || true
    for i in $(ip -o link 2>/dev/null | awk -F': ' '{print $2}' | grep '^ttc-v' | cut -d@ -f1 || true); do
        ip link del "$i" 2>/dev/null || true
    done
    rm -rf "$STATE"
    echo "cluster down"
}

status() {
    if [[ ! -f $STATE/nodes ]]; then echo "no cluster ($STATE/nodes missing)"; return 1; fi
    local node
    for node in $(nodes); do
        printf '%-8s %-12s %-16s %s\n' "$node" "$NS${node#node}" \
            "$(ip -n "$NS${node#node}" -o -4 addr show eth0 2>/dev/null | awk '{print $4}')" \
            "$(ip netns exec "$NS${node#node}" tc qdisc show dev eth0 2>/dev/null | grep -o 'tbf.*rate [^ ]*' || true)"
    done
    echo "env: source $STATE/env   (SLURM_CONF, mpirun rsh agent $STATE/rsh-agent)"
    if [[ -f $STATE/slurm/slurm.conf ]]; then
        enter node1 env SLURM_CONF="$STATE/slurm/slurm.conf" sinfo -N 2>&1 || true
    fi
}

case ${1:-} in
    up) shift; up "$@" ;;
    down) down ;;
    status) status ;;
    exec)
        shift; node=${1:?usage: cluster.sh exec NODE CMD...}; shift
        grep -qx "$node" "$STATE/nodes" 2>/dev/null || die "no node '$node' (cluster.sh status lists them)"
        # shellcheck disable=SC1091
        source "$STATE/env"
        enter "$node" "$@" ;;
    _enter) shift; node=$1; shift; enter "$node" "$@" ;;
    *) echo "usage: cluster.sh up N | down | status | exec NODE CMD..." >&2; exit 2 ;;
esac
