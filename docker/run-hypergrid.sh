#!/bin/sh
# Runs on the launching node: waits until every host of the hostfile answers over ssh, then runs
# the HyperGrid example across them. `gflowdist run` starts hydra's mpiexec with the extra
# arguments `-launcher ssh -f HOSTFILE`, so hydra starts its proxy on each host over ssh and the
# ranks fill the hosts in hostfile order (node0:2, node1:2 -> trainers 0,1 on node0; buffer 2 and
# coordinator 3 on node1: every trajectory crosses the network).
#
#   run-hypergrid.sh [key.path=value ...]        e.g. run-hypergrid.sh run.steps=2000
#
# Environment: HOSTFILE (/etc/gflowdist/hostfile), NPROCS (4), OUT_DIR (/runs: a volume every
# node mounts, since every rank writes its log and checkpoint into the run directory),
# GFLOWDIST_DIR (/opt/gflowdist), SSH_WAIT_S (60).
set -eu
hostfile=${HOSTFILE:-/etc/gflowdist/hostfile}
nprocs=${NPROCS:-4}
out_dir=${OUT_DIR:-/runs}
deadline=$(( $(date +%s) + ${SSH_WAIT_S:-60} ))
cut -d: -f1 "$hostfile" | while IFS= read -r host; do
    case "$host" in ''|'#'*) continue ;; esac
    until ssh -n "$host" true; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "run-hypergrid.sh: $host did not answer over ssh within ${SSH_WAIT_S:-60} s" >&2
            exit 1
        fi
        sleep 1
    done
done
cd "${GFLOWDIST_DIR:-/opt/gflowdist}"
exec gflowdist run examples/hypergrid/config.yaml -n "$nprocs" "run.out_dir=$out_dir" \
    "launch.mpiexec_args=[-launcher, ssh, -f, $hostfile]" "$@"
