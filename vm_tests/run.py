#!/usr/bin/env python3
"""Run the project's pytest suite inside a VM booted with another kernel.

Boots a kernel (by default Debian's newest /boot/vmlinuz-*-amd64, a 6.1
distro kernel) with virtme-ng under TCG (never KVM: KVM guests hang on the
machines this project runs on), runs pytest as root inside against a
snapshot of this project tree taken at the start (shared over 9p), and
brings back the pytest output,
a summary line, the junit XML and the guest's kernel log.

    .venv/bin/python vm_tests/run.py [--kernel PATH] [--tests 'pytest args']
                                     [--timeout SECS] [--allow-empty] [-v]

Exit code: pytest's (0 = all passed).  pytest's 5 ("no tests ran") counts
as a failure unless --allow-empty.  124 when the run timed out, 3 when the
VM never reported a result (boot failure, panic), 2 for a setup problem.

Standard library only.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent
OUT = HERE / "out"
# The VM's own tests (one attachment shared), then issue 29's packet-table
# tests of CE skip, probe backoff and port status through the real programs
# (one more compile and verification: the harness compiles with bcc).
DEFAULT_TESTS = "vm_tests tests/datapath/test_congestion.py tests/datapath/test_ports.py"
# Files the guest writes into OUT (cleared before each run).
RESULT_FILES = ("rc", "pytest.txt", "junit.xml", "dmesg.txt", "console.log",
                "guest.sh", "timing.txt", "roce.log")


def say(msg: str) -> None:
    print(f"vm-test: {msg}", flush=True)


def die(msg: str, code: int = 2) -> "None":
    print(f"vm-test: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


# --------------------------------------------------------------------------
# Kernel and headers
# --------------------------------------------------------------------------

def _version_key(path: str) -> list:
    ver = Path(path).name.removeprefix("vmlinuz-")
    return [int(p) if p.isdigit() else p for p in re.split(r"[.\-]", ver)]


def find_kernel(arg: str | None) -> Path:
    chosen = arg or os.environ.get("KERNEL")
    if chosen:
        path = Path(chosen)
        if not path.is_file():
            die(f"kernel {chosen} does not exist")
        return path.resolve()
    found = glob.glob("/boot/vmlinuz-*-amd64")
    if not found:
        die("no /boot/vmlinuz-*-amd64: run vm_tests/setup.sh "
            "(apt-get install linux-image-amd64), or pass --kernel / KERNEL=")
    return Path(max(found, key=_version_key))


def kernel_version(path: Path) -> str:
    """The release string (`uname -r` inside the VM) of a bzImage.

    x86 boot protocol: the 16-bit word at 0x20e points (relative to 0x200)
    at a NUL-terminated "<release> (<builder>) #..." string.  Falls back to
    the file name (vmlinuz-<release>)."""
    try:
        with open(path, "rb") as f:
            head = f.read(0x10000)
        if head[0x202:0x206] == b"HdrS":
            off = int.from_bytes(head[0x20E:0x210], "little") + 0x200
            raw = head[off:off + 256].split(b"\0", 1)[0].decode("ascii", "replace")
            if raw.strip():
                return raw.split()[0]
    except OSError:
        pass
    name = path.name
    if name.startswith("vmlinuz-"):
        return name.removeprefix("vmlinuz-")
    die(f"cannot tell the kernel release of {path} (not a bzImage?)")
    return ""


def check_headers(ver: str) -> None:
    """bcc inside the VM compiles against /lib/modules/<ver>/build."""
    build = Path(f"/lib/modules/{ver}/build")
    if build.exists():
        return
    usr_src = Path(f"/usr/src/linux-headers-{ver}")
    hint = (f"apt-get install linux-headers-{ver}   (Debian; vm_tests/setup.sh "
            "installs linux-headers-amd64, which tracks linux-image-amd64)")
    if usr_src.is_dir():
        hint = f"ln -s {usr_src} {build}"
    die(f"no kernel headers for {ver}: {build} is missing, and bcc inside "
        f"the VM needs it.\n  Fix: {hint}\n  (a custom kernel: link {build} "
        "to its build tree, after `make headers_install modules_prepare`)")


def find_vng() -> Path:
    # The venv's bin dir is not necessarily on PATH: look next to the
    # interpreter (do not resolve the venv's python symlink).
    local = Path(sys.executable).parent / "vng"
    if local.is_file() and os.access(local, os.X_OK):
        return local
    on_path = shutil.which("vng")
    if on_path:
        return Path(on_path)
    die("vng (virtme-ng) not found next to "
        f"{sys.executable} nor on PATH: run vm_tests/setup.sh")
    raise AssertionError


def check_host_tools() -> None:
    if not shutil.which("qemu-system-x86_64"):
        die("qemu-system-x86_64 not found: run vm_tests/setup.sh "
            "(apt-get install qemu-system-x86)")
    if not any(shutil.which(b) for b in ("busybox-static", "busybox.static", "busybox")) \
            and not Path("/bin/busybox").exists():
        die("busybox not found (virtme-ng builds its initramfs with it): "
            "run vm_tests/setup.sh (apt-get install busybox-static)")


# --------------------------------------------------------------------------
# The guest side
# --------------------------------------------------------------------------

def host_bpffs_mounts() -> list[str]:
    """bpffs mount points on the host: the guest gets the same ones (its
    /run is fresh), so code that expects e.g. a pin root mounted by
    `make setup` finds it in the VM too."""
    found = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == "bpf":
                    path = fields[1].replace("\\040", " ")
                    if path not in found:
                        found.append(path)
    except OSError:
        pass
    return found


def snapshot() -> Path:
    """A copy of the tree as it is now, for the guest to test: edits made
    while a run takes its quarter of an hour must not reach it half-way.
    It lives in OUT, inside the tree the guest sees; the venv stays put
    (it finds the copy's packages first: they are in the working directory)."""
    tree = OUT / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=PROJECT,
                            capture_output=True)
    if listed.returncode == 0:
        files = [f for f in listed.stdout.decode().split("\0") if f]
    else:   # not a git checkout: everything but the venv and our own output
        files = [str(p.relative_to(PROJECT)) for p in PROJECT.rglob("*")
                 if p.is_file() and not {".venv", ".git"} & set(p.relative_to(PROJECT).parts)]
    out_rel = OUT.relative_to(PROJECT)
    for name in files:
        src = PROJECT / name
        if Path(name).is_relative_to(out_rel) or not src.is_file():
            continue
        dst = tree / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    return tree


def guest_script(pytest_args: list[str], pytest_timeout: int,
                 bpffs: list[str], tree: Path) -> str:
    out = shlex.quote(str(OUT))
    project = shlex.quote(str(tree))
    python = shlex.quote(str(PROJECT / ".venv" / "bin" / "python"))
    junit = shlex.quote(str(OUT / "junit.xml"))
    args = " ".join(shlex.quote(a) for a in pytest_args)
    mounts = " ".join(shlex.quote(p) for p in ["/sys/fs/bpf", *bpffs])
    return f"""#!/bin/bash
# Written by vm_tests/run.py; runs inside the VM as root.
out={out}
echo "boot_s $(cut -d' ' -f1 /proc/uptime)" > "$out/timing.txt"
echo "guest kernel: $(uname -r)"
# bpffs is not mounted at boot: /sys/fs/bpf, plus every bpffs the host has.
for m in {mounts}; do
    mkdir -p "$m" 2>/dev/null
    mountpoint -q "$m" 2>/dev/null || mount -t bpf bpf "$m" || \\
        echo "vm-test: warning: cannot mount bpffs at $m" >&2
done
[ -e "/lib/modules/$(uname -r)/build" ] || \\
    echo "vm-test: warning: no /lib/modules/$(uname -r)/build: bcc will fail" >&2
cd {project} || exit 1
export PATH={shlex.quote(str(PROJECT / ".venv" / "bin"))}:$PATH
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# For tests: they run under TCG emulation, ~5-50x slower than the host
# (a bcc compile takes ~1 min): scale subprocess timeouts by this.
export MRC_IN_VM=1 MRC_TIMEOUT_SCALE=5
# the RoCE lab's timestamped steps (mrc_ebpf/lab/roce.py)
export MRC_ROCE_LOG="$out/roce.log"
# the guest's compiled datapaths (its kernel's), kept in its own /tmp
export MRC_EBPF_CACHE=/tmp/mrc-ebpf-cache
# SIGINT first, so pytest still prints what it has (and the junit XML);
# the dmesg dump below must happen whatever pytest does.
timeout --signal=INT --kill-after=30 {pytest_timeout} \\
    {python} -m pytest {args} -p no:cacheprovider -ra --junitxml={junit} \\
    > "$out/pytest.txt" 2>&1
rc=$?
echo "pytest_end_s $(cut -d' ' -f1 /proc/uptime)" >> "$out/timing.txt"
dmesg > "$out/dmesg.txt" 2>&1
echo "$rc" > "$out/rc"
sync
echo "vm-test: guest done, pytest exit $rc"
"""


# --------------------------------------------------------------------------
# Host side: run, report
# --------------------------------------------------------------------------

SUMMARY_RE = re.compile(r"^=+ (.*(?:passed|failed|error|skipped|no tests ran|xfailed|xpassed|deselected).*) =+$")


def summary_line(pytest_out: str) -> str | None:
    for line in reversed(pytest_out.splitlines()):
        m = SUMMARY_RE.match(line.strip())
        if m:
            return m.group(1)
    return None


def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def tail(text: str, n: int) -> str:
    return "\n".join(text.splitlines()[-n:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", help="kernel image (default: $KERNEL, else the "
                    "newest /boot/vmlinuz-*-amd64)")
    ap.add_argument("--tests", default=os.environ.get("VM_TESTS", DEFAULT_TESTS),
                    help=f"pytest arguments, one string (default: '{DEFAULT_TESTS}')")
    ap.add_argument("--timeout", type=int, default=int(os.environ.get("VM_TIMEOUT", 2400)),
                    help="whole run, boot included, in seconds (default 2400)")
    ap.add_argument("--allow-empty", action="store_true",
                    help="pytest's exit 5 (no tests ran) is not a failure")
    ap.add_argument("--memory", default="2G")
    ap.add_argument("--cpus", default="2")
    ap.add_argument("--dmesg-lines", type=int, default=80,
                    help="how much of the guest's dmesg to print on failure")
    ap.add_argument("--bpffs", action="append", default=[], metavar="PATH",
                    help="also mount a bpffs at PATH in the guest (the host's "
                    "bpffs mount points are mirrored anyway)")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="stream the VM console while it runs")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the vng command and the guest script, run nothing")
    opts = ap.parse_args()

    kernel = find_kernel(opts.kernel)
    ver = kernel_version(kernel)
    check_headers(ver)
    vng = find_vng()
    check_host_tools()
    if not (PROJECT / ".venv" / "bin" / "python").exists():
        die(f"no project venv at {PROJECT / '.venv'} (make setup)")

    pytest_args = shlex.split(opts.tests)
    # Leave time after pytest for dmesg and shutdown (and before, for boot).
    pytest_timeout = max(60, opts.timeout - 90)

    OUT.mkdir(exist_ok=True)
    for name in RESULT_FILES:
        (OUT / name).unlink(missing_ok=True)
    script = OUT / "guest.sh"
    bpffs = [p for p in host_bpffs_mounts() + opts.bpffs if p != "/sys/fs/bpf"]
    bpffs = list(dict.fromkeys(bpffs))
    tree = snapshot()
    script.write_text(guest_script(pytest_args, pytest_timeout, bpffs, tree))
    script.chmod(0o755)

    cmd = [str(vng), "--run", str(kernel),
           "--disable-kvm",          # KVM guests hang here: TCG only
           "--force-9p",
           "--memory", opts.memory, "--cpus", str(opts.cpus),
           "--rwdir", str(PROJECT),  # pytest writes results into the tree
           "--cwd", str(PROJECT),
           "--exec", f"bash {shlex.quote(str(script))}"]
    # vng execs virtme-run, which lives beside it.
    env = dict(os.environ)
    env["PATH"] = f"{vng.parent}{os.pathsep}{env.get('PATH', '')}"

    say(f"kernel {kernel} ({ver}), headers /lib/modules/{ver}/build")
    say(f"pytest {' '.join(pytest_args)}   (timeout {opts.timeout} s, TCG: "
        "boot ~20 s, each bcc compile ~1 min)")
    if opts.dry_run:
        print(shlex.join(cmd))
        print(script.read_text())
        return 0

    start = time.monotonic()
    timed_out = False
    with open(OUT / "console.log", "wb") as console:
        proc = subprocess.Popen(cmd, cwd=PROJECT, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = start + opts.timeout
        next_note = start + 120
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        while True:
            chunk = None
            try:
                chunk = proc.stdout.read()
            except BlockingIOError:
                pass
            if chunk:
                console.write(chunk)
                console.flush()
                if opts.verbose:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
            if proc.poll() is not None and not chunk:
                break
            if time.monotonic() > deadline:
                timed_out = True
                # Only the process group this runner started (vng, qemu).
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=15)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait()
                break
            if not opts.verbose and time.monotonic() > next_note:
                # A sign of life for CI logs: where pytest has got to.
                next_note += 120
                last = tail(read(OUT / "pytest.txt"), 1).strip()
                say(f"... {time.monotonic() - start:.0f} s: {last[-100:] or 'booting'}")
            if not chunk:
                time.sleep(0.2)
    wall = time.monotonic() - start

    pytest_out = read(OUT / "pytest.txt")
    dmesg = read(OUT / "dmesg.txt")
    rc_text = read(OUT / "rc").strip()
    timing = dict(line.split(None, 1) for line in read(OUT / "timing.txt").splitlines()
                  if len(line.split(None, 1)) == 2)

    if pytest_out:
        print("=" * 30 + " pytest output (in the VM) " + "=" * 30)
        print(pytest_out.rstrip())
        print("=" * 87)

    if rc_text.isdigit():
        rc = int(rc_text)
        if rc == 5 and opts.allow_empty:
            rc_final = 0
        else:
            rc_final = rc
        if rc == 124 or (timed_out and rc != 0):
            say(f"pytest was stopped by the timeout ({pytest_timeout} s in the guest)")
    else:
        rc = None
        rc_final = 124 if timed_out else 3
        what = (f"timed out after {opts.timeout} s" if timed_out
                else f"vng exited {proc.returncode}")
        say(f"the VM did not report a result ({what}); last console lines "
            f"(full log: {OUT / 'console.log'}):")
        print(tail(read(OUT / "console.log"), 40))

    summary = summary_line(pytest_out) if pytest_out else None
    if rc_final != 0 and dmesg:
        print("-" * 30 + f" guest dmesg (last {opts.dmesg_lines} lines) " + "-" * 30)
        print(tail(dmesg, opts.dmesg_lines))
        print("-" * 87)

    times = f"wall {wall:.0f} s"
    if "boot_s" in timing:
        times += f", boot {float(timing['boot_s']):.0f} s"
        if "pytest_end_s" in timing:
            times += f", pytest {float(timing['pytest_end_s']) - float(timing['boot_s']):.0f} s"
    verdict = "PASS" if rc_final == 0 else "FAIL"
    detail = summary or ("pytest exit 5: no tests ran" if rc == 5 else "no pytest summary")
    say(f"{verdict}: {detail}  [kernel {ver}; {times}; pytest exit "
        f"{rc if rc is not None else '-'}]")
    say(f"results in {OUT.relative_to(PROJECT)}/: pytest.txt junit.xml dmesg.txt console.log")
    return rc_final


if __name__ == "__main__":
    sys.exit(main())
