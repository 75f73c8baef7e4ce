#!/usr/bin/env bash
# Installs what mrc-ebpf needs on a Debian 12 machine; does nothing that
# is already done.  `make setup` runs it; `make test` and `make demo` run
# `make setup` first.
set -euo pipefail
cd "$(dirname "$0")/.."

# libbpf-dev: only its bpf/bpf.h, against which tests/test_layout.py checks the loader's
# libbpf structs (mrc_ebpf/datapath/bpfsys.py)
APT_PACKAGES="python3-bpfcc bpfcc-tools bpftool libbpf1 libbpf-dev linux-headers-amd64 iproute2 iputils-ping
              iperf3 tcpdump ethtool python3-venv python3-matplotlib python3-jsonschema
              xdp-tools mptcpd"
missing=""
for p in $APT_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "setup: installing Debian packages:$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi

# bcc compiles against /lib/modules/$(uname -r)/{build,source}.  A kernel
# without its own headers gets Debian's newest (UAPI is all we use),
# linked the way Debian lays them out (BCC_KERNEL_SOURCE alone does not
# work with the split -amd64/-common layout).
kver=$(uname -r)
if [ ! -e "/lib/modules/$kver/build/Makefile" ]; then
    hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n1)
    [ -n "$hdr" ] || { echo "setup: no linux-headers-*-amd64 in /usr/src" >&2; exit 1; }
    echo "setup: linking $hdr for kernel $kver"
    mkdir -p "/lib/modules/$kver"
    ln -sfn "$hdr" "/lib/modules/$kver/build"
    ln -sfn "${hdr%-amd64}-common" "/lib/modules/$kver/source"
fi

# bcc lives in Debian's dist-packages: the venv must see system packages,
# and must be made by Debian's interpreter, not a pyenv one.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import bcc" 2>/dev/null; then
    echo "setup: creating .venv"
    rm -rf .venv
    /usr/bin/python3 -m venv --system-site-packages .venv
fi
if ! .venv/bin/python -c "import mrc_ebpf.cli, pyroute2, click, scapy, tabulate, pytest, prometheus_client, ansible" 2>/dev/null \
        || [ ! -x .venv/bin/mrcctl ]; then
    echo "setup: installing mrc-ebpf into .venv"
    .venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
fi

# the bpffs that pins live on (see mrc_ebpf/pins.py for why /run)
mkdir -p /run/mrc-ebpf
grep -qs " /run/mrc-ebpf bpf " /proc/mounts || mount -t bpf bpf /run/mrc-ebpf

# iproute2 names the routes' protocol (routes.py ROUTE_PROTO) `mrc`
mkdir -p /etc/iproute2/rt_protos.d
[ -f /etc/iproute2/rt_protos.d/mrc.conf ] || printf '77\tmrc\n' > /etc/iproute2/rt_protos.d/mrc.conf
