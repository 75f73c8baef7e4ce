#!/bin/bash
# Time `mrcctl path bulk` of N template peers (default 131,071: every other
# NIC of MRC's 8-plane fabric) on 8 templates of 256 paths, in a namespace
# of its own, and print the maps' memory as status reports it.
# Usage: scripts/bulk_apply.sh [N]      (root; removes what it made)
set -euo pipefail
N=${1:-131071}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
M=$ROOT/.venv/bin/mrcctl
NS=mrcbulk$$
WORK=$(mktemp -d)
ip netns add $NS
trap 'ip netns exec $NS $M detach eth0 >/dev/null 2>&1 || true; ip netns del $NS; rm -rf $WORK' EXIT
ip -n $NS link add eth0 type veth peer name up0
ip -n $NS link set eth0 up; ip -n $NS link set up0 up; ip -n $NS link set lo up
ip -n $NS -6 route add fc00::/16 via fe80::1 dev eth0
ip netns exec $NS $M attach eth0 --sid fc00:ffff::1 >/dev/null
vias=(); for s in $(seq 1 256); do vias+=(--via "fc00:0:$(printf %x $((0x100 + s)))::"); done
t0=$(date +%s.%N)
for t in 0 1 2 3 4 5 6 7; do ip netns exec $NS $M path template add leaf$t "${vias[@]}" >/dev/null; done
t1=$(date +%s.%N)
python3 - "$N" > $WORK/peers <<'PY'
import sys
for i in range(int(sys.argv[1])):
    leaf, host = divmod(i, 256)
    print(f"fd00:{leaf // 64 + 1:x}:{leaf:x}:{host:x}::/64 leaf{leaf % 8} fc00:1:{leaf:x}:{host:x}::")
PY
t2=$(date +%s.%N)
ip netns exec $NS $M path bulk $WORK/peers --no-route >/dev/null
t3=$(date +%s.%N)
ip netns exec $NS $M status -j | python3 -c "
import json, sys
r = json.load(sys.stdin)[0]
print(f\"peers {r['peers']}, kernel memory {r['memory']['bytes']} B here, \"
      f\"{r['memory']['scaled_bytes']} B at {r['memory']['scaled_cpus']} CPUs\")"
python3 -c "print(f'8 templates x 256 paths: {$t1 - $t0:.1f} s; path bulk of $N peers: {$t3 - $t2:.1f} s')"
