#!/bin/sh
# ssh stand-in that "logs into" a network-namespace host made by tests/netns.py.
#
#   launch-into-netns.sh [ssh options] HOST COMMAND...
#
# MPICH's hydra calls it exactly like ssh (`mpiexec -launcher ssh
# -launcher-exec launch-into-netns.sh`): ssh options first (hydra passes -x,
# "no X11 forwarding"), then the host name from the hostfile, then the remote
# command as separate words that ssh would join with spaces and hand to the
# remote shell. Here HOST must be the name of a network namespace
# (/var/run/netns/HOST); the command runs inside it, in a fresh UTS namespace
# whose host name is HOST:
#
#   ip netns exec HOST unshare --uts sh -c 'hostname HOST && exec COMMAND'
#
# COMMAND is one simple command (hydra's proxy command line, or a shlex-quoted
# argv from tests/netns.py). Every step execs, so the pid hydra started ends up
# being the command itself and hydra's signals reach it directly.
# `ip netns exec` also bind-mounts /etc/netns/HOST/hosts over /etc/hosts,
# which is how the hosts resolve each other's names.
set -eu

while [ $# -gt 0 ]; do
    case "$1" in
        -x|-X|-T|-n|-q) shift ;;
        -*) echo "launch-into-netns.sh: unsupported ssh option '$1'" >&2; exit 255 ;;
        *) break ;;
    esac
done
if [ $# -lt 2 ]; then
    echo "usage: launch-into-netns.sh [-x] HOST COMMAND..." >&2
    exit 255
fi
host=$1
shift
if [ ! -e "/var/run/netns/$host" ]; then
    echo "launch-into-netns.sh: no network namespace named '$host' (see 'ip netns list')" >&2
    exit 255
fi
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$1" && eval "exec $2"' launch-into-netns "$host" "$*"
