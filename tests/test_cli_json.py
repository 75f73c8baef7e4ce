"""mrcctl's conventions for scripts: -j is one document per line with a
fixed shape (-p indents it), errors are JSON under -j, routes show as
`proto mrc`, verbs that need root say so, and shell completion completes
devices."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, mrcctl

pytestmark = pytest.mark.root


def _one_line(result) -> object:
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    return json.loads(lines[0])


def test_json_lines_shapes_errors_and_route_name(interop):
    A = interop.A
    att = _one_line(mrcctl("attach", "a0", "--sid", interop.A_SID, "-j", netns=A))
    assert att["device"] == "a0"
    added = _one_line(mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, "-j", netns=A))
    assert isinstance(added, list) and len(added) == 1 and added[0]["path_id"] == 0
    two = _one_line(mrcctl("path", "add", "fd00:2::/64", "--via", f"{interop.R_SID},{interop.B_DT6}",
                           "--via", interop.B_DT6, "-j", netns=A))
    assert isinstance(two, list) and len(two) == 2
    for verb in (("status",), ("path", "list"), ("stats",), ("stats", "--paths"), ("class", "list")):
        _one_line(mrcctl(*verb, "-j", netns=A))
    pretty = mrcctl("status", "-p", netns=A).stdout
    assert len(pretty.splitlines()) > 1 and json.loads(pretty)[0]["device"] == "a0"
    assert json.loads(mrcctl("-p", "stats", netns=A).stdout)["device"] == "a0"
    # an error under -j: {"error": ...} on stdout too, exit 1, nothing else
    bad = mrcctl("path", "add", "not-a-prefix", "--via", interop.B_DT6, "-j", netns=A, check=False)
    assert bad.returncode == 1 and set(_one_line(bad)) == {"error"}
    assert bad.stderr.startswith("mrcctl: error:") and len(bad.stderr.splitlines()) == 1
    # the routes mrcctl installs are `proto mrc` to iproute2
    shown = interop.t.exec(A, ["ip", "-6", "route", "show", "proto", "mrc"]).stdout
    assert "fd00:2::/64" in shown and "proto" not in shown.replace("proto mrc", "")
    listed = interop.t.exec(A, ["ip", "-6", "route", "show", "fd00:2::/64"]).stdout
    assert "proto mrc" in listed, listed
    # detach is a list, for one device as for --all
    gone = _one_line(mrcctl("detach", "a0", "-j", netns=A))
    assert isinstance(gone, list) and gone[0]["device"] == "a0" and gone[0]["routes"] >= 1
    assert _one_line(mrcctl("detach", "--all", "-j", netns=A)) == []


def _as_nobody_in(netns_name: str, argv: list[str]) -> tuple[int, str]:
    """mrcctl ARGV as uid 65534 inside NETNS (entered while still root)."""
    from click.testing import CliRunner
    from pyroute2 import netns
    from mrc_ebpf.cli.mrcctl import cli
    import mrc_ebpf.datapath.loader  # noqa: F401  (imported lazily by the verbs)
    import mrc_ebpf.control.status  # noqa: F401
    import mrc_ebpf.control.paths  # noqa: F401
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            netns.setns(netns_name)
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            result = CliRunner().invoke(cli, argv, obj={})
            os.write(write, f"{result.exit_code}\n{result.output}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        code, output = f.read().split("\n", 1)
    os.waitpid(pid, 0)
    return int(code), output


def test_verbs_say_needs_root(interop):
    interop.attach()
    for argv in (["status"], ["path", "list"], ["stats"], ["stats", "--paths"], ["detach", "a0"],
                 ["path", "add", "fd00:2::/64", "--via", interop.B_DT6], ["exporter", "--once"]):
        code, output = _as_nobody_in(interop.A, argv)
        assert code == 1 and "needs root" in output and "damaged" not in output, (argv, output)
        assert "Traceback" not in output
    # and the state is intact for root
    assert json.loads(mrcctl("status", "-j", netns=interop.A).stdout)[0]["healthy"]


def _complete(words: str) -> list[str]:
    env = {**os.environ, "_MRCCTL_COMPLETE": "bash_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
    out = subprocess.run([str(Path(sys.executable).parent / "mrcctl")], env=env, capture_output=True,
                         text=True, cwd=ROOT, timeout=60)
    return [line.split(",", 1)[1] for line in out.stdout.splitlines() if "," in line]


def test_shell_completion_devices(interop):
    interop.attach()
    assert "a0" in _complete(f"mrcctl --netns {interop.A} attach ")
    assert _complete(f"mrcctl --netns {interop.A} detach ") == ["a0"]
    assert "a0" in _complete(f"mrcctl --netns {interop.A} stats --dev ")
    assert interop.A in _complete(f"mrcctl --netns {interop.A[:-1]}")
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=interop.A)
    assert _complete(f"mrcctl --netns {interop.A} path del ") == ["fd00:2::/64"]
