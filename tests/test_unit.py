"""Tests that need no root and no kernel: wire format, constants from the
C header, CLI argument errors."""
from __future__ import annotations

import ctypes

from click.testing import CliRunner
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting

from mrc_ebpf.cli.mrcctl import cli
from mrc_ebpf.datapath import layout, source, wire
from mrc_ebpf.control import paths
from mrc_ebpf.datapath.source import C


def test_constants_come_from_the_header():
    assert C["MRC_TLV_TYPE"] in range(124, 127)       # IANA SRH TLV experimental range
    assert C["MRC_TLV_LEN"] == C["MRC_TLV_SIZE"] - 2
    assert C["MRC_MAX_PATHS"] >= 256 and C["MRC_MAX_SEGMENTS"] >= 4
    names = source.counter_names()
    assert names[0] == "tx_seen" and "rx_decap" in names and len(names) == len(set(names))


def test_default_active_peers_sizes_the_maps_as_the_header_does():
    """attach's LRU sizes for the default active peers are the header's
    own (a second definition of them, so checked here)."""
    from mrc_ebpf.datapath import loader, memory
    sizes = loader.active_sizes(None)
    assert {m: sizes["mrc_" + m] for m in memory.SIZED} == {m: C[c] for m, c in memory.SIZED.items()}


def test_tlv_keeps_srh_aligned_and_ctypes_matches_size():
    assert C["MRC_TLV_SIZE"] % 8 == 0
    assert ctypes.sizeof(layout.MrcTlv) == C["MRC_TLV_SIZE"]
    for n in range(1, C["MRC_MAX_SEGMENTS"] + 1):
        assert layout.srh_len(n) % 8 == 0
        assert layout.encap_len(n) == 40 + 8 + 16 * n + C["MRC_TLV_SIZE"]


def test_scapy_layer_matches_ctypes_wire_layout():
    """The scapy layer (second definition) against layout.MrcTlv, which
    test_layout.py checks against the C struct."""
    values = dict(path_id=0x1234, tclass=3, path_seq=0xDEADBEEF, peer_seq=7, tx_ns=0x0102030405060708, flags=1)
    from_scapy = bytes(wire.MrcTLV(**values))
    c = layout.MrcTlv(type=C["MRC_TLV_TYPE"], len=C["MRC_TLV_LEN"], version=C["MRC_VERSION"], **values)
    assert from_scapy == bytes(c)
    names = [f.name for f in wire.MrcTLV.fields_desc]
    assert names == [n for n, _ in layout.MrcTlv._fields_]


def test_capture_decodes_mrc_tlv():
    pkt = IPv6(bytes(IPv6(dst="fc00::1") / IPv6ExtHdrSegmentRouting(
        addresses=["fc00::1"], tlv_objects=[wire.MrcTLV(path_id=9, path_seq=42)]) / IPv6()))
    tlv = wire.mrc_tlv(pkt)
    assert tlv is not None and (tlv.path_id, tlv.path_seq) == (9, 42)


def test_peer_keys_ipv4_mapped_and_back():
    for text in ("fd00:2::/64", "198.18.2.0/24", "198.18.0.0/15", "fd00::/8"):
        prefix = paths.parse_prefix(text)
        assert paths.key_prefix(paths.peer_key(prefix)) == prefix
    assert paths.peer_key(paths.parse_prefix("198.18.2.0/24")).prefixlen == 120


def test_source_expansion_inlines_each_header_once():
    text = source.expand()
    assert "int mrc_tx(struct __sk_buff *skb)" in text and "int mrc_rx(struct xdp_md *ctx)" in text
    assert text.count("BPF_ARRAY(mrc_config,") == 1
    assert '#include "' not in text


def run(*args):
    return CliRunner().invoke(cli, list(args), obj={})


def test_cli_usage_errors_exit_1_in_one_line():
    # one line and exit 1, as docs/ops.md promises (click's own: usage lines, exit 2)
    for args in (["attach"], ["attach", "eth0"], ["path", "add", "fd00::/64"], ["bogus"],
                 ["attach", "eth0", "--sid", "fc00::1", "--mode", "fast"], ["detach"]):
        result = run(*args)
        assert result.exit_code == 1, (args, result.output)
        assert "Traceback" not in result.output and len(result.output.splitlines()) == 1


def test_cli_help_lists_verbs():
    result = run("--help")
    for verb in ("attach", "detach", "status", "stats", "path"):
        assert verb in result.output
