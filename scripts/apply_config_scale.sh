#!/bin/bash
# `mrcctl apply` of one host's config rendered from a fabric description of
# 131,072 NICs in 8 planes as `fabric plan --nics 131072 --planes 8 --radix
# 512` gives them (512 leaves of 256 hosts, 256 spines a plane: render
# deals each plane's spines into 8 groups, so 8 templates of 256 paths, and
# each of the 131,071 other NICs on one of them), in a namespace of its own
# with the host's 8 plane devices.  Prints, in seconds:
#   attach   apply of the attach section alone (the bcc compile)
#   apply    apply of the whole rendered config onto that attachment
#   again    the same file again (nothing to change)
#   show     show-config of the running config (131,071 peers read back)
# and whether show-config's output is the rendered file's config; then
# once, a first apply (attach and config in one command).
# Usage: scripts/apply_config_scale.sh [RUNS]   (root; removes what it made)
set -euo pipefail
RUNS=${1:-1}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}     # PY=...: another interpreter (a worktree without its own .venv)
M="$PY -m mrc_ebpf.cli.mrcctl"
NS=mrcapply$$
WORK=$(mktemp -d)
trap 'ip netns exec $NS $M detach --all >/dev/null 2>&1 || true; ip netns del $NS 2>/dev/null || true; rm -rf $WORK' EXIT
cat > $WORK/fabric.yaml <<'YAML'
version: 1
fabric: {name: mrc128k, planes: 8, spines: 256, leaves: 512, hosts_per_leaf: 256, encoding: srh, rate: none}
YAML
$M render $WORK/fabric.yaml --host h1000 -o $WORK/h1000.yaml
python3 - $WORK/h1000.yaml > $WORK/attach.yaml <<'PY'
import sys
lines = open(sys.argv[1]).read().split("\n")
print("\n".join(lines[:lines.index("templates:")]))
PY
ip netns add $NS
for p in 0 1 2 3 4 5 6 7; do
  ip -n $NS link add eth$p type veth peer name up$p
  ip -n $NS link set eth$p up; ip -n $NS link set up$p up
  # plane p's spines: wide IDs (p+1)<<12 | s beyond 255 spines (Fabric.plane_spines)
  ip -n $NS -6 route add fc00:0:$(printf %x $(((p + 1) << 12)))::/36 via fe80::1 dev eth$p
done
ip -n $NS link set lo up
ip -n $NS -6 route add fd00::/16 via fe80::1 dev eth0
t() { local s=$(date +%s.%N); "$@" >/dev/null; python3 -c "print(f'{$(date +%s.%N) - $s:.2f}')"; }
echo "load: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs, $(wc -c < $WORK/h1000.yaml) bytes of config"
for run in $(seq 1 $RUNS); do
  a=$(t ip netns exec $NS $M apply $WORK/attach.yaml)
  b=$(t ip netns exec $NS $M apply $WORK/h1000.yaml)
  c=$(t ip netns exec $NS $M apply $WORK/h1000.yaml)
  s0=$(date +%s.%N); ip netns exec $NS $M show-config > $WORK/shown.yaml
  d=$(python3 -c "print(f'{$(date +%s.%N) - $s0:.2f}')")
  same=$("$PY" -c "
import sys
from mrc_ebpf.control import config
a, b = (config.load(open(f).read(), f).data for f in sys.argv[1:])
print('the same config' if a == b else 'DIFFERENT')" $WORK/shown.yaml $WORK/h1000.yaml)
  peers=$(ip netns exec $NS $M status -j | python3 -c "import json,sys; print(json.load(sys.stdin)[0]['peers'])")
  echo "run $run: attach $a s, apply $b s, again $c s, show $d s (shown: $same as rendered), peers $peers"
  ip netns exec $NS $M detach --all >/dev/null
done
# a first apply: attach (the compile) and the whole config in one command
f=$(t ip netns exec $NS $M apply $WORK/h1000.yaml)
echo "first apply (attach + config): $f s"
