"""`mrcctl apply FILE` / `show-config`: a host's whole config as one file.

Applying is idempotent (the maps, counters included, are byte for byte
the same after a second apply), a changed file changes only what differs
(the paths that stay keep counting under traffic), an invalid file is
refused with its line and changes nothing, and a failure forced at any
write midway leaves everything as it was."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import click
import pytest

from conftest import MRCCTL, ROOT, mrcctl
from mrc_ebpf.control import config

# ---- the format alone (no kernel) ------------------------------------------

GOOD = """\
version: 1
attach:
  devices: [a0]
  sid: "fc00:a:0::6"
  probe_us: 4000
classes:
  - name: gold
    dscp: [46, 10]
peers:
  - prefix: fd00:2::1/64
    route_metrics: {rto_min: 10ms, reordering: none}
    paths:
      - via: [fc00:b::6]
      - via: ["fc00:1::", fc00:b::6]
        weight: 2
        class: gold
      - entropy: 2
        sid: fc00:b::6
      - entropy: 1
        sid: "fc00:b:0::6"
      - usid: "fc00:0:101:e002::"
        denied: true
"""


def test_canonical_form_is_stable_and_explicit():
    c = config.load(GOOD, "good.yaml")
    text = config.dump(c.data)
    assert config.load(text).data == c.data and config.dump(config.load(text).data) == text
    attach = c.data["attach"]
    assert list(attach) == [k for k in config.ATTACH_KEYS if k != "key_file"]
    assert attach["sid"] == "fc00:a::6" and attach["mode"] == "auto" and attach["probe_us"] == 4000
    peer = c.data["peers"][0]
    assert peer["prefix"] == "fd00:2::/64" and peer["policy"] == "bytes"     # the default
    assert peer["route_metrics"] == {"rto_min": "10ms", "reordering": "none"}
    # neighbouring entropy entries alike but for their count are one; defaults left out
    assert peer["paths"] == [{"via": ["fc00:b::6"]},
                             {"via": ["fc00:1::", "fc00:b::6"], "weight": 2, "class": "gold"},
                             {"entropy": 3, "sid": "fc00:b::6"},
                             {"usid": "fc00:0:101:e002::", "denied": True}]
    assert c.data["classes"] == [{"name": "gold", "dscp": [10, 46]}]


BASE = 'version: 1\nattach:\n  devices: [a0]\n  sid: "fc00:a::6"\n'
PEER = "peers:\n  - prefix: fd00:2::/64\n    paths:\n"


@pytest.mark.parametrize("text, line, reason", [
    ("version: 2\nattach:\n  devices: [a0]\n  sid: fc00::1\n", 1, "unsupported version 2"),
    ("version: '1'\nattach:\n  devices: [a0]\n  sid: fc00::1\n", 1, "version must be an integer"),
    (BASE + "  probe_us: fast\n", 5, "probe_us must be an integer, not 'fast'"),
    (BASE + "  probe_us: 5\n", 5, "probe_us 5 is out of range 10..10000000"),
    (BASE + "  retrans_steer: 1\n", 5, "retrans_steer must be true or false"),
    (BASE + "  speed: 9\n", 5, "unknown key 'speed' in attach"),
    (BASE + "  sid: fc00::2\n", 5, "'sid' given twice in attach"),
    ('version: 1\nattach:\n  devices: [a0]\n  sid: "fc00::zz"\n', 4, "bad SID 'fc00::zz'"),
    (BASE + PEER + "      - via: [fc00:b::6, 'fd00::1::2']\n", 8, "bad segment 'fd00::1::2'"),
    (BASE + PEER + "      - via: [fc00:b::6]\n        weight: 2\n        colour: red\n", 10,
     "unknown key 'colour' in a path"),
    (BASE + PEER + "      - via: [fc00:b::6]\n      - usid: 'fc00:0:101::'\n"
                   "      - via: ['fc00:b:0::6']\n", 10,
     "duplicate path via fc00:b::6 to fd00:2::/64 (first at line 8)"),
    (BASE + PEER + "      - via: [fc00:b::6]\n        class: gold\n", 9, "no class 'gold'"),
    (BASE + PEER + "      - entropy: 4\n", 8, "entropy: N needs sid: PEER_SID"),
    (BASE + "peers:\n  - prefix: fd00:2::/64\n    route_metrics: {rto_min: 5 years}\n"
                    "    paths: [{via: [fc00:b::6]}]\n", 7, "bad route metric 'rto_min=5 years'"),
    (BASE + "peers:\n  - prefix: fd00:2::/64\n    paths: [{via: [fc00:b::6]}]\n"
                    "  - prefix: fd00:2::9/64\n    paths: [{via: [fc00:b::7]}]\n", 8,
     "peer fd00:2::/64 is given twice (first at line 6)"),
    (BASE + "classes:\n  - {name: a, dscp: [8]}\n  - {name: b, dscp: [9, 8]}\n", 7,
     "DSCP 8 is in class a already"),
    ("version: 1\nattach: [\n", 3, "not valid YAML"),
    ("", 1, "empty"),
])
def test_invalid_files_name_their_line(text, line, reason):
    with pytest.raises(config.ConfigError) as e:
        config.load(text, "host.yaml")
    message = str(e.value)
    assert message.startswith(f"host.yaml:{line}: ") and reason in message, message
    assert "\n" not in message


def test_attach_ranges_are_those_of_mrcctl_attach():
    from mrc_ebpf.cli.mrcctl import attach
    options = {p.name: p for p in attach.params}
    for name, (lo, hi) in {**config.TIMER_RANGES, "min_active": config.MIN_ACTIVE_RANGE,
                           **config.SETTING_RANGES}.items():
        kind = options[name].type
        assert isinstance(kind, click.IntRange) and (kind.min, kind.max) == (lo, hi), name
    assert tuple(options["mode"].type.choices) == config.MODES
    assert tuple(options["granularity"].type.choices) == config.GRANULARITIES


# ---- on a real attachment -----------------------------------------------------

def host_config(interop, third=("fc00:1::", "fc00:1::"), policy="rr", extra_peer=True) -> str:
    """A's config on the KernelPeerLine: three SRH paths to B's End.DT6
    (straight, over R, over R twice), a class, an IPv4 peer."""
    i = interop
    segs = ", ".join(f'"{s}"' for s in (*third, i.B_DT6))
    text = f"""\
version: 1
attach:
  devices: [a0]
  sid: "{i.A_SID}"
  probe_us: 4000
classes:
  - name: gold
    dscp: [46]
peers:
  - prefix: "fd00:2::/64"
    policy: {policy}
    paths:
      - via: ["{i.B_DT6}"]
      - via: ["{i.R_SID}", "{i.B_DT6}"]
        weight: 2
      - via: [{segs}]
"""
    if extra_peer:
        text += f"""\
  - prefix: "198.18.2.0/24"
    route_metrics:
      rto_min: 10ms
    paths:
      - via: ["{i.B_DX4}"]
      - via: ["{i.R_SID}", "{i.B_DX4}"]
        class: gold
"""
    return text


def apply(interop, tmp_path, text, *extra, check=True, env=None, name="host.yaml"):
    path = tmp_path / name
    path.write_text(text)
    if env is None:
        return mrcctl("apply", str(path), "-j", *extra, netns=interop.A, check=check)
    return subprocess.run([*MRCCTL, "--netns", interop.A, "apply", str(path), "-j", *extra],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def shown(interop) -> str:
    return mrcctl("show-config", netns=interop.A).stdout


def counters(interop) -> dict[int, int]:
    rows = json.loads(mrcctl("path", "list", "-j", netns=interop.A).stdout)
    return {(r["prefix"], tuple(r["segments"])): (r["path_id"], r["tx_packets"]) for r in rows}




@pytest.mark.root
def test_apply_round_trip_and_idempotence(interop, tmp_path):
    from test_all_or_nothing import state
    t, A = interop.t, interop.A
    text = host_config(interop)
    first = json.loads(apply(interop, tmp_path, text).stdout)
    assert first["attached"] and first["changed"]
    assert interop.ping(A, interop.B6, count=3).returncode == 0
    assert interop.ping(A, interop.B4, count=3).returncode == 0
    # applied, then shown: the canonical form of the file
    assert shown(interop) == config.dump(config.load(text).data)
    before = state(t, A)
    again = apply(interop, tmp_path, text)
    assert json.loads(again.stdout) == {**first, "attached": False, "changed": False, "changes": []}
    human = mrcctl("apply", str(tmp_path / "host.yaml"), netns=A).stdout
    assert "no change" in human
    # every map, counters included, as it was
    assert state(t, A) == before
    # show-config | apply -: a no-op as well
    piped = subprocess.run([*MRCCTL, "--netns", A, "apply", "-", "-j"], input=shown(interop),
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert piped.returncode == 0 and json.loads(piped.stdout)["changed"] is False, piped.stderr
    assert state(t, A) == before


@pytest.mark.root
def test_a_changed_path_leaves_the_others_counting(interop, tmp_path):
    """Under a ping flood, a file whose third path differs is applied:
    the other two keep their ids and counters and keep counting, and no
    ping is lost."""
    A = interop.A
    apply(interop, tmp_path, host_config(interop, extra_peer=False))
    ping = interop.t.popen(A, ["ping", "-c", "20000", "-i", "0.005", "-W", "2", interop.B6],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1)
        before = counters(interop)
        changed = host_config(interop, third=("fc00:1::",) * 3, extra_peer=False)
        result = json.loads(apply(interop, tmp_path, changed, name="changed.yaml").stdout)
        after_apply = counters(interop)
        time.sleep(1)
        ping.send_signal(signal.SIGINT)     # ping prints its statistics
        out, err = ping.communicate(timeout=60)
    finally:
        if ping.poll() is None:
            ping.kill()
            ping.wait()
    after = counters(interop)
    kinds = sorted((c["what"], c.get("action")) for c in result["changes"])
    assert kinds == [("path", "add"), ("path", "delete")], result
    prefix = "fd00:2::/64"
    kept = [(prefix, (interop.B_DT6,)), (prefix, (interop.R_SID, interop.B_DT6))]
    for key in kept:
        assert after_apply[key][0] == before[key][0], key            # same id
        assert after_apply[key][1] >= before[key][1], key            # not reset
        assert after[key][1] > after_apply[key][1], key              # still counting
    new = (prefix, ("fc00:1::",) * 3 + (interop.B_DT6,))
    old = (prefix, ("fc00:1::",) * 2 + (interop.B_DT6,))
    assert old not in after and after[new][1] > 0
    assert after[new][0] == before[old][0]      # the freed id is taken again
    sent, received = map(int, re.search(r"(\d+) packets transmitted, (\d+) received", out).groups())
    assert sent > 200 and sent - received <= 1, out     # one may be in flight at the SIGINT
    assert shown(interop) == config.dump(config.load(changed).data)


@pytest.mark.root
def test_policy_weight_class_and_metrics_change_in_place(interop, tmp_path):
    A = interop.A
    apply(interop, tmp_path, host_config(interop))
    assert interop.ping(A, interop.B6, count=5).returncode == 0
    before = counters(interop)
    text = host_config(interop, policy="weighted").replace("weight: 2", "weight: 3").replace(
        "rto_min: 10ms", "rto_min: 20ms").replace("probe_us: 4000", "probe_us: 6000")
    result = json.loads(apply(interop, tmp_path, text, name="h2.yaml").stdout)
    whats = sorted(c["what"] for c in result["changes"])
    assert whats == ["attach", "path", "policy", "route_metrics"], result
    assert not any(c.get("action") in ("add", "delete") for c in result["changes"])
    assert counters(interop) == before      # nothing reset, nothing renumbered
    assert shown(interop) == config.dump(config.load(text).data)
    status = json.loads(mrcctl("status", "-j", netns=A).stdout)[0]
    assert {r["prefix"]: r["route_metrics"]["rto_min"] for r in status["routes"]}["198.18.2.0/24"] == "20ms"


@pytest.mark.root
def test_invalid_files_change_nothing(interop, tmp_path):
    from test_all_or_nothing import one_line_error, state
    t, A = interop.t, interop.A
    text = host_config(interop)
    apply(interop, tmp_path, text)
    before = state(t, A)
    bad = {
        "bad address": (text.replace(f'"{interop.R_SID}", ', '"fc00:1::zz", '), 14, "bad segment"),
        "unknown key": (text.replace("    policy: rr\n", "    policy: rr\n    speed: 9\n"), 12,
                        "unknown key 'speed'"),
        "bad type": (text.replace("weight: 2", "weight: two"), 15, "weight must be an integer"),
        "wrong version": (text.replace("version: 1", "version: 7"), 1, "unsupported version 7"),
        "duplicate path": (text.replace('via: ["fc00:1::", "fc00:1::", ', 'via: ['), 16,
                           "duplicate path via fc00:b::6 to fd00:2::/64 (first at line 13)"),
        # valid, but refused by the kernel side midway: named by the path's line
        "unroutable first hop": (text.replace(f'["{interop.B_DX4}"]', '["fd00:ffff::1"]'), 21,
                                 "no route to first segment fd00:ffff::1"),
    }
    for name, (bad_text, line, reason) in bad.items():
        result = apply(interop, tmp_path, bad_text, check=False, name="bad.yaml")
        one_line_error(result, reason)
        assert f"bad.yaml:{line}: " in result.stderr, (name, result.stderr)
        assert json.loads(result.stdout)["error"], name
        assert state(t, A) == before, f"{name} changed something"
    # devices, SID or XDP mode differ: a re-attach, refused without --reattach
    result = apply(interop, tmp_path, text.replace(interop.A_SID, "fc00:a::7"), check=False)
    one_line_error(result, "--reattach")
    assert state(t, A) == before


@pytest.mark.root
def test_failure_midway_rolls_back(interop, tmp_path):
    """Each write of an apply that changes a path, a class, a policy,
    metrics and a timer fails in turn; after each, everything is as before."""
    from test_all_or_nothing import one_line_error, state
    t, A = interop.t, interop.A
    apply(interop, tmp_path, host_config(interop))
    before = state(t, A)
    changed = host_config(interop, third=("fc00:1::",) * 3, policy="weighted").replace(
        "dscp: [46]", "dscp: [46, 10]").replace("rto_min: 10ms", "rto_min: 30ms").replace(
        "probe_us: 4000", "probe_us: 7000")
    n = 0
    while True:
        n += 1
        assert n < 200, "apply never finished"
        result = apply(interop, tmp_path, changed, env={**os.environ, "MRC_FAIL_WRITE": str(n)},
                       name="changed.yaml")
        if result.returncode == 0:
            break
        one_line_error(result, f"failure injected at write {n}")
        assert state(t, A) == before, f"failing write {n} left a change behind"
    assert n > 20 and state(t, A) != before
    assert shown(interop) == config.dump(config.load(changed).data)


@pytest.mark.root
def test_failed_first_apply_leaves_nothing_attached(interop, tmp_path):
    A = interop.A
    for n in (1, 5, 17):
        result = apply(interop, tmp_path, host_config(interop), check=False,
                       env={**os.environ, "MRC_FAIL_WRITE": str(n)})
        assert result.returncode == 1 and f"failure injected at write {n}" in result.stderr
        assert json.loads(mrcctl("status", "-j", netns=A).stdout) == []
        routes = interop.t.exec(A, ["ip", "-6", "route", "show", "proto", "77"]).stdout
        assert routes.strip() == ""


@pytest.mark.root
def test_attach_options_in_place_and_reattach(interop, tmp_path):
    """Timers, granularity and the key change in place (the paths keep
    their counters); the SID needs a re-attach, done with --reattach."""
    from mrc_ebpf.datapath import auth
    A = interop.A
    k1, k2 = tmp_path / "k1.key", tmp_path / "k2.key"
    k1.write_text("00112233445566778899aabbccddeeff\n")
    k2.write_text("ffeeddccbbaa99887766554433221100\n")
    base = host_config(interop, extra_peer=False)
    keyed = base.replace("  probe_us: 4000\n", "  probe_us: 4000\n  key_file: k1.key\n")
    apply(interop, tmp_path, keyed)
    shown_text = shown(interop)
    assert f"key_file: {k1}" in shown_text and "mode: auto" in shown_text
    assert shown_text == config.dump(config.load(keyed, base=tmp_path).data)

    def key_ids():
        return [k["key_id"] for k in json.loads(mrcctl("key", "show", "-j", netns=A).stdout)["keys"]]
    assert key_ids() == [auth.key_id(bytes.fromhex(k1.read_text().strip()))]
    assert interop.ping(A, interop.B6, count=3).returncode == 0
    before = counters(interop)
    changed = keyed.replace("k1.key", "k2.key").replace("  probe_us: 4000\n",
                                                        "  probe_us: 4000\n  granularity: burst\n"
                                                        "  mode: skb\n  min_active: 2\n")
    result = json.loads(apply(interop, tmp_path, changed, name="h2.yaml").stdout)
    assert sorted(c["key"] for c in result["changes"]) == ["granularity", "key_file", "min_active", "mode"]
    assert key_ids() == [auth.key_id(bytes.fromhex(k2.read_text().strip()))]
    link = json.loads(interop.t.exec(A, ["ip", "-d", "-j", "link", "show", "a0"]).stdout)[0]
    assert link["gso_max_segs"] > 1
    assert counters(interop) == before
    assert shown(interop) == config.dump(config.load(changed, base=tmp_path).data)
    # dry run: says, changes nothing
    dry = json.loads(apply(interop, tmp_path, keyed, "--dry-run", name="h3.yaml").stdout)
    assert dry["changed"] and dry["dry_run"]
    assert shown(interop) == config.dump(config.load(changed, base=tmp_path).data)
    # a new SID: refused without --reattach, done with it
    moved = changed.replace(interop.A_SID, "fc00:a::7")
    from test_all_or_nothing import one_line_error
    one_line_error(apply(interop, tmp_path, moved, check=False, name="h4.yaml"), "sid fc00:a::6 -> fc00:a::7")
    result = json.loads(apply(interop, tmp_path, moved, "--reattach", name="h4.yaml").stdout)
    assert result["reattached"]
    assert shown(interop) == config.dump(config.load(moved, base=tmp_path).data)


@pytest.mark.root
def test_entropy_paths_match_by_their_place_among_a_sids(interop, tmp_path):
    """EVs to one SID are told apart by their order: adding a 4th keeps
    the others' ids and labels; denying the 2nd splits the entry."""
    A, sid = interop.A, interop.B_DT6
    head = host_config(interop, extra_peer=False).split("    paths:\n")[0] + "    paths:\n"
    three = head + f'      - via: ["{sid}"]\n      - entropy: 3\n        sid: "{sid}"\n'
    apply(interop, tmp_path, three)
    assert shown(interop) == config.dump(config.load(three).data)
    rows = json.loads(mrcctl("path", "list", "-j", netns=A).stdout)
    evs = {r["path_id"]: r["flowlabel"] for r in rows if r["encoding"] == "entropy"}
    assert sorted(evs) == [1, 2, 3]
    denied = head + (f'      - via: ["{sid}"]\n      - entropy: 1\n        sid: "{sid}"\n'
                     f'      - entropy: 1\n        sid: "{sid}"\n        denied: true\n'
                     f'      - entropy: 2\n        sid: "{sid}"\n')
    result = json.loads(apply(interop, tmp_path, denied, name="d.yaml").stdout)
    assert [(c["action"], c.get("path_id")) for c in result["changes"]] == [("add", None), ("change", 2)]
    rows = json.loads(mrcctl("path", "list", "-j", netns=A).stdout)
    assert {r["path_id"]: r["flowlabel"] for r in rows if r["encoding"] == "entropy"} == {**evs, 4: rows[-1]["flowlabel"]}
    assert [r["state"] == "denied" for r in rows] == [False, False, True, False, False]
    assert shown(interop) == config.dump(config.load(denied).data)
    assert json.loads(apply(interop, tmp_path, denied, name="d.yaml").stdout)["changed"] is False


@pytest.mark.root
def test_spare_evs_in_the_config(interop, tmp_path):
    """entropy: N with spare: M: M more EVs held back (path list: spare);
    shown back as written, applied again unchanged, one more spare added
    alone; spare: on a path that is not entropy is a one-line error."""
    A, sid = interop.A, interop.B_DT6
    head = host_config(interop, extra_peer=False).split("    paths:\n")[0] + "    paths:\n"
    text = head + f'      - via: ["{sid}"]\n      - entropy: 3\n        spare: 2\n        sid: "{sid}"\n'
    apply(interop, tmp_path, text)
    rows = json.loads(mrcctl("path", "list", "-j", netns=A).stdout)
    assert [(r["path_id"], r["spare"], r["state"] == "spare") for r in rows if r["encoding"] == "entropy"] == \
        [(1, False, False), (2, False, False), (3, False, False), (4, True, True), (5, True, True)]
    assert shown(interop) == config.dump(config.load(text).data)
    assert json.loads(apply(interop, tmp_path, text, name="again.yaml").stdout)["changed"] is False
    more = text.replace("spare: 2", "spare: 3")
    result = json.loads(apply(interop, tmp_path, more, name="more.yaml").stdout)
    assert [c["action"] for c in result["changes"]] == ["add"]
    rows = json.loads(mrcctl("path", "list", "-j", netns=A).stdout)
    assert [r["path_id"] for r in rows if r["spare"]] == [4, 5, 6]
    assert shown(interop) == config.dump(config.load(more).data)
    from test_all_or_nothing import one_line_error
    bad = head + f'      - via: ["{sid}"]\n        spare: 2\n'
    one_line_error(apply(interop, tmp_path, bad, check=False, name="bad.yaml"), "spare: M is for entropy paths")
