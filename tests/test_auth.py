"""Authenticated feedback and sender epochs, by BPF_PROG_TEST_RUN on the
real programs: what the receiver files, by packets signed in Python
(an independent SipHash-2-4, checked against the paper's vector), and
the MAC the sender writes, checked the same way.  The attacks from a
third host on a live fabric are in test_auth_attacks.py."""
from __future__ import annotations

import ctypes
import ipaddress
import struct

import pytest
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.layers.l2 import Ether

from mrc_ebpf.datapath import auth, bpfsys, layout, wire
from mrc_ebpf.datapath.source import C, counter_names

SID, PEER_SID = "fc00:a::1", "fc00:b::1"
KEY1, KEY2, OTHER = bytes(range(16)), bytes(range(16, 32)), bytes(range(32, 48))
XDP_PASS, XDP_DROP = 2, 1
EPOCH = 1000


def eth():
    """The frames' Ethernet header, addresses given: scapy resolves a
    missing dst by a neighbour solicitation on the host's own network (a
    1 s wait a frame, and traffic outside the test's namespaces)."""
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


def test_siphash_matches_the_reference_vectors():
    """SipHash-2-4 paper, appendix A: key 00..0f, messages 00..(n-1)."""
    assert auth.siphash24(bytes(range(16)), b"") == 0x726fdb47dd0e0e31
    assert auth.siphash24(bytes(range(16)), bytes(range(15))) == 0xa129ca6149be45e5
    assert auth.siphash24(bytes(range(16)), bytes(range(8))) == 0x93f5f5799a932462


def test_key_files_bad_input_one_line(tmp_path):
    from mrc_ebpf.errors import MrcError
    cases = {"missing": None, "short": "abcd\n", "two": "00" * 16 + "\n" + "11" * 16 + "\n",
             "zero": "00" * 16 + "\n", "nothex": "zz" * 16 + "\n"}
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(MrcError) as e:
            auth.read_key(path)
        assert "\n" not in str(e.value) and str(path) in str(e.value)
    good = tmp_path / "good"
    good.write_text("# the fabric's key\n" + KEY1.hex() + "\n")
    assert auth.read_key(good) == KEY1


@pytest.fixture(scope="module")
def dp():
    from mrc_ebpf.datapath.loader import compile_datapath
    module, tx, rx, _ = compile_datapath()
    cfg = layout.Config(mtu=1500)
    ctypes.memmove(cfg.sid, ipaddress.IPv6Address(SID).packed, 16)
    module["mrc_config"][ctypes.c_int(0)] = module["mrc_config"].Leaf.from_buffer_copy(bytes(cfg))
    sid = layout.Sid()
    ctypes.memmove(sid.addr, ipaddress.IPv6Address(PEER_SID).packed, 16)
    module["mrc_peer_by_sid"][module["mrc_peer_by_sid"].Key.from_buffer_copy(bytes(sid))] = ctypes.c_uint32(0)
    yield module, tx, rx
    module.cleanup()


def set_keys(module, keys, signing=1, epoch=77):
    value = layout.Auth(epoch=epoch, tx_slot=signing if keys else 0)
    for i, k in enumerate(keys):
        value.keys[i] = auth.auth_key(k)
    module["mrc_auth"][ctypes.c_int(0)] = module["mrc_auth"].Leaf.from_buffer_copy(bytes(value))


def counters(module) -> dict[str, int]:
    table = module["mrc_counters"]
    return {name: table.sum(ctypes.c_int(i)).value for i, name in enumerate(counter_names())}


def rx_path(module, path_id=0):
    for k, v in module["mrc_rx_paths"].items():
        if bytes(k.sid) == ipaddress.IPv6Address(PEER_SID).packed and k.path_id == path_id:
            return layout.RxPath.from_buffer_copy(bytes(v))
    return None


def clear_rx(module):
    module["mrc_rx_paths"].clear()
    module["mrc_rx_peers"].clear()


def feedback(seq, key=None, epoch=EPOCH, key_id=None, qdelay=123, mac=None, src=PEER_SID):
    """A feedback-only packet from the peer, signed with KEY as the peer
    would (or not), as it arrives at our SID."""
    tlv = wire.MrcTLV(flags=C["MRC_F_FEEDBACK"] | C["MRC_F_CONTROL"], path_id=0, path_seq=seq,
                      peer_seq=seq, epoch=epoch, fb_path_id=3, fb_qdelay_us=qdelay,
                      key_id=key_id if key_id is not None else (auth.key_id(key) if key else 0))
    if mac is not None:
        tlv.mac = mac
    elif key:
        tlv.mac = auth.tlv_mac(key, src, SID, bytes(tlv))
    return bytes(eth() / IPv6(src=src, dst=SID) /
                 IPv6ExtHdrSegmentRouting(addresses=[SID], segleft=0, lastentry=0, tlv_objects=[tlv]) /
                 IPv6(src="fd00:b::b", dst="fd00:a::a", nh=59))


def run_rx(module, rx, frame):
    before = counters(module)
    ret, _, _ = bpfsys.prog_test_run(rx.fd, frame, 1)
    after = counters(module)
    return ret, {k: after[k] - before[k] for k in after if after[k] != before[k]}


def health_qdelay(module, path_id=3):
    return module["mrc_row_state"][ctypes.c_uint32(0)].paths[path_id].health.qdelay_us


@pytest.mark.root
def test_receiver_files_only_authentic_fresh_feedback(dp):
    module, _, rx = dp
    set_keys(module, [KEY1, KEY2])
    clear_rx(module)
    ret, d = run_rx(module, rx, feedback(10, KEY1, qdelay=111))
    assert ret == XDP_DROP and d.get("rx_feedback") == 1 and health_qdelay(module) == 111
    # the same packet again: its path's newest number, taken for a later
    # segment of its burst (lib/rx_track.h): counted, not filed
    ret, d = run_rx(module, rx, feedback(10, KEY1, qdelay=111))
    assert d.get("rx_segment") == 1 and "rx_feedback" not in d and "rx_auth_replay" not in d
    # the second key is accepted as well (a roll-over in progress)
    ret, d = run_rx(module, rx, feedback(11, KEY2, qdelay=222))
    assert d.get("rx_feedback") == 1 and health_qdelay(module) == 222
    # late but new (within the window): filed; behind the window: not
    for seq, filed in ((12, True), (9, True), (9, False), (100, True), (100 - 66, False)):
        ret, d = run_rx(module, rx, feedback(seq, KEY1, qdelay=seq))
        assert (d.get("rx_feedback") == 1) == filed, (seq, d)
    # forgeries, each counted by its reason, none filed
    signed = IPv6(feedback(204, KEY1, qdelay=9999)[14:])
    moved = eth() / IPv6(bytes(signed))
    moved[IPv6].src = "fc00:c::1"           # a MAC made for the peer's source, from another
    forged = [("rx_auth_no_mac", feedback(200, None, qdelay=9999)),
              ("rx_auth_unknown_key", feedback(201, OTHER, qdelay=9999)),
              ("rx_auth_bad_mac", feedback(202, KEY1, qdelay=9999, mac=bytes(8))),
              ("rx_auth_old_epoch", feedback(203, KEY1, epoch=EPOCH - 1, qdelay=9999)),
              ("rx_auth_bad_mac", bytes(moved))]
    for reason, frame in forged:
        ret, d = run_rx(module, rx, frame)
        assert d.get(reason) == 1 and "rx_feedback" not in d, (reason, d)
        assert health_qdelay(module) != 9999


@pytest.mark.root
def test_without_a_key_everything_is_filed_as_before(dp):
    module, _, rx = dp
    set_keys(module, [])
    clear_rx(module)
    for seq, frame in enumerate([feedback(1, None, qdelay=5), feedback(0, None, qdelay=6),
                                 feedback(2, OTHER, qdelay=7), feedback(3, KEY1, mac=bytes(8), qdelay=8)]):
        ret, d = run_rx(module, rx, frame)
        assert d.get("rx_feedback") == 1 and not any(k.startswith("rx_auth") for k in d), d
    assert health_qdelay(module) == 8


@pytest.mark.root
def test_a_new_epoch_restarts_the_senders_tracking(dp):
    """A re-attached sender numbers from 0 again: with a new epoch the
    receiver starts afresh (no late packets); the same numbers without a
    new epoch are late, which shows the test can fail."""
    module, _, rx = dp
    for keys in ([], [KEY1]):
        set_keys(module, keys)
        key = keys[0] if keys else None
        clear_rx(module)
        for seq in range(1000, 1010):
            run_rx(module, rx, feedback(seq, key, epoch=EPOCH))
        ret, d = run_rx(module, rx, feedback(0, key, epoch=EPOCH + 5))
        assert d.get("rx_epoch") == 1 and d.get("rx_feedback") == 1, d
        for seq in range(1, 10):
            run_rx(module, rx, feedback(seq, key, epoch=EPOCH + 5))
        p = rx_path(module)
        assert (p.late, p.lost, p.next_seq, p.epoch) == (0, 0, 10, EPOCH + 5)
        # the control: an old number again within one epoch is late (with
        # a key it is a replay, and not counted)
        run_rx(module, rx, feedback(3, key, epoch=EPOCH + 5))
        assert rx_path(module).late == (0 if key else 1)


def tx_frame():
    return bytes(eth() /
                 IPv6(src="fd00:a::a", dst="fd00:b::b") / UDP(dport=9) / bytes(64))


def configure_peer(module, usid=False):
    from mrc_ebpf.control.paths import MAX_CLASSES, POLICIES, peer_key
    path = layout.Path(n_segments=1 if usid else 2, state=layout.C["MRC_PATH_UP"], weight=1,
                       flags=layout.C["MRC_PATH_F_USID"] if usid else 0)
    segs = ("fc00:1:2:e00b::",) if usid else (PEER_SID, "fc00:1:1::")
    for j, seg in enumerate(segs):
        ctypes.memmove(path.segments[j].addr, ipaddress.IPv6Address(seg).packed, 16)
    ctypes.memmove(path.peer_sid.addr, ipaddress.IPv6Address("fc00:1:e00b::" if usid else PEER_SID).packed, 16)
    module["mrc_paths"][ctypes.c_int(0)] = module["mrc_paths"].Leaf.from_buffer_copy(bytes(path))
    spray = layout.Spray(n=1)
    for tclass in range(MAX_CLASSES):
        module["mrc_spray"][ctypes.c_int(tclass)] = module["mrc_spray"].Leaf.from_buffer_copy(bytes(spray))
    prefix = ipaddress.ip_network("fd00:b::/64")
    key = module["mrc_peers"].Key.from_buffer_copy(bytes(peer_key(prefix)))
    module["mrc_peers"][key] = module["mrc_peers"].Leaf.from_buffer_copy(
        bytes(layout.Peer(peer_id=0, n_paths=1, policy=POLICIES["rr"])))
    return "fc00:1:e00b::" if usid else PEER_SID


@pytest.mark.root
@pytest.mark.parametrize("usid", [False, True], ids=["srh", "usid"])
def test_sender_signs_what_it_sends(dp, usid):
    """The MAC mrc_tx writes is SipHash-2-4 (Python's) of our SID, the
    peer's SID and the TLV; with no key, no MAC and key id 0."""
    from scapy.layers.inet6 import IPv6ExtHdrDestOpt
    module, tx, _ = dp
    final = configure_peer(module, usid)
    for keys, signing in (([KEY1], 1), ([KEY1, KEY2], 2), ([], 0)):
        set_keys(module, keys, signing, epoch=4242)
        ret, _, out = bpfsys.prog_test_run(tx.fd, tx_frame(), 1)
        assert ret == 0
        pkt = Ether(out)
        if usid:
            assert pkt.haslayer(IPv6ExtHdrDestOpt)
        tlv = wire.mrc_tlv(pkt)
        assert tlv is not None and tlv.epoch == 4242
        if not keys:
            assert tlv.key_id == 0 and tlv.mac == bytes(8)
            continue
        key = keys[signing - 1]
        assert tlv.key_id == auth.key_id(key)
        assert tlv.mac == auth.tlv_mac(key, SID, final, bytes(tlv))
        assert tlv.mac != auth.tlv_mac(OTHER, SID, final, bytes(tlv))


def peer_state(module, peer_id=0) -> layout.PeerState:
    return layout.PeerState.from_buffer_copy(bytes(module["mrc_peer_state"][ctypes.c_uint32(peer_id)]))


def tx_prefix(module, peer_id=0) -> layout.MacPrefix:
    return peer_state(module, peer_id).tx_mac


@pytest.mark.root
@pytest.mark.parametrize("usid", [False, True], ids=["srh", "usid"])
def test_sender_kept_state_signs_as_python_does(dp, usid):
    """mrc_tx keeps SipHash's state after the constant words per peer
    (its learnt state's tx_mac): every MAC made from the kept state, with and without
    feedback, after a key change, an epoch change and a spoiled entry, is
    Python's SipHash-2-4 of the whole message (auth.mac_message)."""
    module, tx, rx = dp
    final = configure_peer(module, usid)
    module["mrc_peer_state"].clear()
    fb = C["MRC_F_FEEDBACK"]
    steps = [("KEY1, no feedback yet", [KEY1], 77, False), ("same, kept state", [KEY1], 77, False),
             ("the peer heard: feedback", [KEY1], 77, True), ("feedback, kept state", [KEY1], 77, True),
             ("another key in the slot", [KEY2], 77, True), ("a new epoch", [KEY2], 78, True),
             ("a spoiled entry", [KEY2], 78, True), ("back to KEY1", [KEY1], 78, False)]
    for name, keys, epoch, with_fb in steps:
        set_keys(module, keys, 1, epoch=epoch)
        clear_rx(module)
        if with_fb:     # the peer sent us something: our TLVs carry feedback for it
            run_rx(module, rx, feedback(5, keys[0], src=final))
        if name == "a spoiled entry":   # its words no longer add up: made again
            state = peer_state(module)
            state.tx_mac.v[0] ^= 1
            module["mrc_peer_state"][ctypes.c_uint32(0)] = module["mrc_peer_state"].Leaf.from_buffer_copy(bytes(state))
        for _ in range(3):
            # the peer's made-up feedback must not take the one path down
            # (a probe carries no feedback): no acknowledgement clock
            if module["mrc_peer_state"].get(ctypes.c_uint32(0)) is not None:
                state = peer_state(module)
                state.acks = layout.PeerAcks()
                module["mrc_peer_state"][ctypes.c_uint32(0)] = \
                    module["mrc_peer_state"].Leaf.from_buffer_copy(bytes(state))
                row = module["mrc_row_state"][ctypes.c_uint32(0)]
                row.paths[0].live = module["mrc_row_state"].Leaf().paths[0].live
                module["mrc_row_state"][ctypes.c_uint32(0)] = row
            ret, _, out = bpfsys.prog_test_run(tx.fd, tx_frame(), 1)
            assert ret == 0
            tlv = wire.mrc_tlv(Ether(out))
            assert bool(tlv.flags & fb) == with_fb, name
            assert tlv.key_id == auth.key_id(keys[0]) and tlv.epoch == epoch, name
            assert tlv.mac == auth.tlv_mac(keys[0], SID, final, bytes(tlv)), name
        kept = tx_prefix(module)
        k0, k1 = struct.unpack("<QQ", keys[0])
        assert (kept.k0, kept.k1) == (k0, k1), name   # the state was kept, for this key


def signed_data(seq, key, src=PEER_SID, flags=0, edit=None):
    """A data packet from the peer (an inner IPv6 packet follows), signed
    with KEY; EDIT(tlv) changes the TLV after signing."""
    tlv = wire.MrcTLV(flags=flags, path_id=1, path_seq=seq, peer_seq=seq, epoch=EPOCH, tx_ns=10**9 + seq,
                      fb_path_id=3, fb_qdelay_us=321, key_id=auth.key_id(key))
    tlv.mac = auth.tlv_mac(key, src, SID, bytes(tlv))
    if edit:
        edit(tlv)
    return bytes(eth() / IPv6(src=src, dst=SID) /
                 IPv6ExtHdrSegmentRouting(addresses=[SID], segleft=0, lastentry=0, tlv_objects=[tlv]) /
                 IPv6(src="fd00:b::b", dst="fd00:a::a", nh=59))


@pytest.mark.root
def test_receiver_verifies_what_the_mac_covers(dp):
    """A table of signed packets through mrc_rx with the receiver's kept
    state (auth_rx_prefix, per sender): what the MAC covers cannot be
    changed; the feedback words are covered when the flags say there is
    feedback (and only then read); a replay is refused; a new key in a
    slot is verified from a new state."""
    module, _, rx = dp
    fb = C["MRC_F_FEEDBACK"]

    def setf(**kv):
        return lambda t: [setattr(t, k, v) for k, v in kv.items()]
    rows = [  # name, keys, frame, counter expected (None: verified and filed)
        ("data, KEY1", [KEY1, KEY2], signed_data(1, KEY1), None),
        ("data, KEY2 (second slot)", [KEY1, KEY2], signed_data(2, KEY2), None),
        # the path's newest number again: a later segment of its burst
        # (lib/rx_track.h), counted and not filed; an older one: a replay
        ("data 2 again: a segment", [KEY1, KEY2], signed_data(2, KEY2), "rx_segment"),
        ("data 1 again: replay", [KEY1, KEY2], signed_data(1, KEY1), "rx_auth_replay"),
        ("path_seq changed", [KEY1, KEY2], signed_data(3, KEY1, edit=setf(path_seq=30)), "rx_auth_bad_mac"),
        ("tx_ns changed", [KEY1, KEY2], signed_data(4, KEY1, edit=setf(tx_ns=5)), "rx_auth_bad_mac"),
        ("path_id changed", [KEY1, KEY2], signed_data(5, KEY1, edit=setf(path_id=2)), "rx_auth_bad_mac"),
        ("tclass changed", [KEY1, KEY2], signed_data(6, KEY1, edit=setf(tclass=3)), "rx_auth_bad_mac"),
        ("epoch changed", [KEY1, KEY2], signed_data(7, KEY1, edit=setf(epoch=EPOCH + 1)), "rx_auth_bad_mac"),
        ("feedback flag set", [KEY1, KEY2], signed_data(8, KEY1, edit=setf(flags=fb)), "rx_auth_bad_mac"),
        ("fb words of a data packet (not read)", [KEY1, KEY2],
         signed_data(9, KEY1, edit=setf(fb_qdelay_us=9999)), None),
        ("feedback", [KEY1, KEY2], signed_data(10, KEY1, flags=fb), None),
        ("feedback, qdelay changed", [KEY1, KEY2],
         signed_data(11, KEY1, flags=fb, edit=setf(fb_qdelay_us=9999)), "rx_auth_bad_mac"),
        ("feedback, heard changed", [KEY1, KEY2],
         signed_data(12, KEY1, flags=fb, edit=setf(fb_heard=0xff)), "rx_auth_bad_mac"),
        ("feedback flag cleared", [KEY1, KEY2], signed_data(13, KEY1, flags=fb, edit=setf(flags=0)),
         "rx_auth_bad_mac"),
        ("another sender, its own MAC", [KEY1, KEY2], signed_data(14, KEY1, src="fc00:c::1"), None),
        ("source moved", [KEY1, KEY2], signed_data(14, KEY1, src="fc00:c::1"), None),  # see below
        ("the peer again", [KEY1, KEY2], signed_data(20, KEY1), None),
        ("KEY2 in slot 0 now: KEY2", [KEY2], signed_data(15, KEY2), None),
        ("KEY2 in slot 0 now: KEY1", [KEY2], signed_data(16, KEY1), "rx_auth_unknown_key"),
        ("KEY1 back, signed with KEY2 under KEY1's id", [KEY1],
         signed_data(17, KEY2, edit=setf(key_id=auth.key_id(KEY1))), "rx_auth_bad_mac"),
    ]
    clear_rx(module)
    module["mrc_auth_rx_prefix"].clear()
    for name, keys, frame, reason in rows:
        set_keys(module, keys)
        if name == "source moved":      # a MAC made for the peer's source, sent from another
            pkt = Ether(frame)
            pkt[IPv6].src = PEER_SID    # signed as from fc00:c::1, arrives from the peer
            frame, reason = bytes(pkt), "rx_auth_bad_mac"
        ret, d = run_rx(module, rx, frame)
        assert ret == XDP_PASS and d.get("rx_decap") == 1, (name, d)   # the data goes on either way
        auth_counts = {k: v for k, v in d.items() if k.startswith("rx_auth") or k == "rx_segment"}
        assert auth_counts == ({reason: 1} if reason else {}), (name, d)
        if reason is None and "feedback" in name:
            assert health_qdelay(module) == 321
    assert health_qdelay(module) != 9999


@pytest.mark.root
def test_key_cli_attach_and_roll_over(interop, tmp_path):
    """--key-file errors are one line and attach nothing; a roll-over goes
    add -> use -> retire, with two keys accepted in between."""
    import json
    from conftest import mrcctl
    A = interop.A
    bad = tmp_path / "bad.key"
    bad.write_text("not a key\n")
    for path in (bad, tmp_path / "missing.key"):
        r = mrcctl("attach", "a0", "--sid", interop.A_SID, "--key-file", str(path), netns=A, check=False)
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "key file" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert "nothing attached" in mrcctl("status", netns=A).stdout
    old, new, third = (tmp_path / f"{n}.key" for n in ("old", "new", "third"))
    old.write_text(KEY1.hex() + "\n")
    new.write_text(KEY2.hex() + "\n")
    third.write_text(OTHER.hex() + "\n")
    out = json.loads(mrcctl("attach", "a0", "--sid", interop.A_SID, "--key-file", str(old), "-j", netns=A).stdout)
    assert out["auth"]["keys"] == [{"slot": 0, "key_id": auth.key_id(KEY1), "signs": True}]

    def show():
        return json.loads(mrcctl("key", "show", "-j", netns=A).stdout)
    epoch = show()["epoch"]
    assert epoch > 0
    mrcctl("key", "add", "--key-file", str(new), netns=A)
    assert {(k["key_id"], k["signs"]) for k in show()["keys"]} == {(auth.key_id(KEY1), True),
                                                                  (auth.key_id(KEY2), False)}
    r = mrcctl("key", "add", "--key-file", str(third), netns=A, check=False)
    assert r.returncode == 1 and "retire" in r.stderr and r.stderr.count("\n") == 1
    mrcctl("key", "use", "--key-file", str(new), netns=A)
    assert {(k["key_id"], k["signs"]) for k in show()["keys"]} == {(auth.key_id(KEY1), False),
                                                                  (auth.key_id(KEY2), True)}
    mrcctl("key", "retire", netns=A)
    assert show()["keys"] == [{"slot": 1, "key_id": auth.key_id(KEY2), "signs": True}]
    mrcctl("key", "clear", netns=A)
    assert show() == {"epoch": epoch, "keys": [], "authenticated": False}


def rx_slot(sid: str) -> int:
    """auth_rx_slot() of lib/auth.h: the receiver's kept-state slot for a sender."""
    s0, s1 = struct.unpack("<QQ", ipaddress.IPv6Address(sid).packed)
    bits = C["MRC_AUTH_RX_SENDERS"].bit_length() - 1
    return (((s0 ^ s1) * 0x9E3779B97F4A7C15) & ((1 << 64) - 1)) >> (64 - bits)


@pytest.mark.root
def test_senders_sharing_a_kept_state_slot_both_verify(dp):
    """Two senders whose SIDs hash to one slot of auth_rx_prefix take it
    from each other, packet by packet: each packet still verifies (the
    slot's words name its sender), and a forgery from either does not."""
    module, _, rx = dp
    set_keys(module, [KEY1])
    clear_rx(module)
    module["mrc_auth_rx_prefix"].clear()
    # senders of a fabric differ anywhere in their SIDs: all of it counts
    assert len({rx_slot(f"fc00:{i:x}::1") for i in range(64)}) > 48
    assert len({rx_slot(f"fc00:0:{i:x}::") for i in range(64)}) > 48
    assert len({rx_slot(f"fc00:c::{i:x}") for i in range(64)}) > 48
    other = next(f"fc00:c::{i:x}" for i in range(1, 1 << 16) if rx_slot(f"fc00:c::{i:x}") == rx_slot(PEER_SID))
    for seq in range(1, 7):
        for src in (PEER_SID, other):
            ret, d = run_rx(module, rx, signed_data(seq, KEY1, src=src))
            assert d.get("rx_decap") == 1 and not any(k.startswith("rx_auth") for k in d), (src, seq, d)
            slot = layout.MacPrefix.from_buffer_copy(
                bytes(module["mrc_auth_rx_prefix"][ctypes.c_int(rx_slot(src))]))
            assert bytes(slot.words[0].to_bytes(8, "little") + slot.words[1].to_bytes(8, "little")) == \
                ipaddress.IPv6Address(src).packed     # the slot is the latest sender's
        ret, d = run_rx(module, rx, signed_data(100 + seq, KEY1, src=other, edit=lambda t: setattr(t, "tx_ns", 1)))
        assert d.get("rx_auth_bad_mac") == 1, d
