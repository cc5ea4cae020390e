# Shared settings of the local SLURM testbed (sourced by up, down, status).
# Everything the testbed creates lives under $TESTBED_DIR, except the network namespaces
# (/run/netns/rs-nodeN), the bridge rs-br0 and the link /etc/slurm/slurm.conf -> $TESTBED_DIR.
TESTBED_DIR=${RAYSTACK_TESTBED_DIR:-/var/lib/raystack-testbed}
BRIDGE=rs-br0
SUBNET=10.200.0
HOST_IP=$SUBNET.1
GPUS_PER_NODE=4
CPUS_PER_NODE=${RAYSTACK_TESTBED_CPUS:-16}
MEM_MB_PER_NODE=${RAYSTACK_TESTBED_MEM_MB:-16000}
SHM_SIZE=${RAYSTACK_TESTBED_SHM:-2g}
SLURM_CONF_LINK=/etc/slurm/slurm.conf

node_ip() { echo "$SUBNET.$((10 + $1))"; }
die() { echo "testbed: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "must run as root (it creates network namespaces and runs slurmd)"; }

# The node count of a running testbed (0 when none is up).
running_nodes() { cat "$TESTBED_DIR/node-count" 2>/dev/null || echo 0; }

# PID of a node's init (PID 1 inside the node), found through the unshare process we started.
node_init_pid() {
    local upid
    upid=$(cat "$TESTBED_DIR/run/node$1.pid" 2>/dev/null) || return 1
    [ -d "/proc/$upid" ] || return 1
    cat "/proc/$upid/task/$upid/children" 2>/dev/null | awk '{print $1}'
}

# The nodes' local disk is the host's /tmp. A new testbed starts SLURM's job ids at 1 again, so
# what an earlier testbed's node programs left there (a node killed with SIGKILL cannot remove
# its Ray temp dir, rs-<job>-<node>-*) would pass for the folder of a new allocation: a fresh
# testbed starts with the clean local disks that real nodes' job ids never collide on.
clear_node_disks() {
    find /tmp -maxdepth 1 -type d -regextype posix-extended -regex '/tmp/rs-[0-9]+-node[0-9]+(-.*)?' \
        -exec rm -rf {} + 2>/dev/null || true
}
