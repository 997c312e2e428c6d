#!/bin/sh
# The `keys` service: one ed25519 key pair for the whole cluster, made once into the shared
# volume; every node installs it as its login key and its authorized key (node-entrypoint.sh).
set -eu
keys=${CLUSTER_KEYS:-/cluster-keys}
if [ ! -f "$keys/id_ed25519" ]; then
    ssh-keygen -q -t ed25519 -N "" -C gflowdist-cluster -f "$keys/id_ed25519"
    echo "make-cluster-key.sh: new key pair in $keys"
fi
