#!/bin/sh
# Entry point of every node: its own ssh host keys, the cluster's login key from the shared
# volume (written by make-cluster-key.sh, the `keys` service), sshd in the background, then
# the container's command (`sleep infinity` on a worker node, run-hypergrid.sh on node0).
set -eu
keys=${CLUSTER_KEYS:-/cluster-keys}
if [ ! -f "$keys/id_ed25519" ] || [ ! -f "$keys/id_ed25519.pub" ]; then
    echo "node-entrypoint.sh: no key pair in $keys: run make-cluster-key.sh into that volume first" \
         "(docker compose runs the 'keys' service before the nodes)" >&2
    exit 1
fi
[ -f /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -A >/dev/null
install -d -m 700 /root/.ssh
install -m 600 "$keys/id_ed25519" /root/.ssh/id_ed25519
install -m 644 "$keys/id_ed25519.pub" /root/.ssh/authorized_keys
/usr/sbin/sshd
exec "$@"
