#!/usr/bin/env bash
# Idempotent install of what `vm_tests/run.py` needs:
#   - Debian: qemu-system-x86 (TCG emulation), busybox-static (virtme-ng
#     builds an initramfs with it: Debian's kernel has 9p/virtio as
#     modules), linux-image-amd64 (the 6.1
#     distro kernel booted in the VM, in /boot) and linux-headers-amd64
#     (bcc inside the VM compiles against /lib/modules/<6.1 ver>/build);
#     rdma-core, ibverbs-providers (librxe), ibverbs-utils (ibv_rc_pingpong)
#     and perftest (ib_write_bw): soft-RoCE in the VM (vm_tests/roce_vm.py;
#     the 6.1 image ships the rdma_rxe module, the host kernel has no RDMA);
#   - PyPI: virtme-ng (the `vng` command) into the project venv.
# Usage: vm_tests/setup.sh [VENV]   (default: the repo's .venv)
# Quiet when everything is already in place.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${1:-$(dirname "$here")/.venv}"

need_root() {
    if [ "$(id -u)" != 0 ]; then
        echo "vm_tests/setup.sh: installing $* needs root" >&2
        exit 1
    fi
}

# --- Debian packages -------------------------------------------------------
missing=()
for pkg in qemu-system-x86 busybox-static linux-image-amd64 linux-headers-amd64 \
           rdma-core ibverbs-providers ibverbs-utils perftest; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    need_root "${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt_opts=(-y -q -o DPkg::Lock::Timeout=600 --no-install-recommends)
    # `apt-get update` only when the package lists don't know a package.
    for pkg in "${missing[@]}"; do
        if ! apt-cache show "$pkg" >/dev/null 2>&1; then
            echo "vm_tests/setup.sh: apt-get update"
            apt-get -q -o DPkg::Lock::Timeout=600 update >/dev/null
            break
        fi
    done
    echo "vm_tests/setup.sh: apt-get install ${missing[*]}"
    if ! apt-get install "${apt_opts[@]}" "${missing[@]}" >/tmp/vm_tests_apt.log 2>&1; then
        # Stale lists (a package version gone from the mirror): refresh once.
        apt-get -q -o DPkg::Lock::Timeout=600 update >/dev/null
        apt-get install "${apt_opts[@]}" "${missing[@]}" >/tmp/vm_tests_apt.log 2>&1 || {
            tail -n 30 /tmp/vm_tests_apt.log >&2
            exit 1
        }
    fi
fi

# The VM boots the newest Debian kernel in /boot; bcc inside needs its
# headers at /lib/modules/<ver>/build (linux-headers-<ver>-amd64 makes the
# link). The -amd64 meta packages normally keep the two in step; say so
# loudly if they are not.
kernel="$(ls -1 /boot/vmlinuz-*-amd64 2>/dev/null | sort -V | tail -n 1 || true)"
if [ -z "$kernel" ]; then
    echo "vm_tests/setup.sh: no /boot/vmlinuz-*-amd64 after installing linux-image-amd64" >&2
    exit 1
fi
kver="${kernel#/boot/vmlinuz-}"
if [ ! -e "/lib/modules/$kver/build" ]; then
    need_root "linux-headers-$kver"
    echo "vm_tests/setup.sh: apt-get install linux-headers-$kver"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=600 \
        --no-install-recommends "linux-headers-$kver" >/tmp/vm_tests_apt.log 2>&1 || {
        tail -n 30 /tmp/vm_tests_apt.log >&2
        exit 1
    }
fi

# --- virtme-ng in the venv -------------------------------------------------
if [ ! -x "$venv/bin/python" ]; then
    echo "vm_tests/setup.sh: no venv at $venv (make it first: /usr/bin/python3 -m venv --system-site-packages $venv)" >&2
    exit 1
fi
if [ ! -x "$venv/bin/vng" ]; then
    echo "vm_tests/setup.sh: pip install virtme-ng into $venv"
    "$venv/bin/python" -m pip install -q virtme-ng
fi
