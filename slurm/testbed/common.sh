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
