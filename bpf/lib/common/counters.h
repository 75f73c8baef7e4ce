/* SPDX-License-Identifier: GPL-2.0 */
/* The counters, named by enum mrc_counter.
 * Part of mrc_common.h (read by mrc_ebpf/datapath/source.py). */
#ifndef MRC_COMMON_COUNTERS_H
#define MRC_COMMON_COUNTERS_H

/* ---- counters: per-CPU array indexed by enum mrc_counter -------------- */
/*
 * Every packet a program sees is counted once in *_SEEN and exactly once
 * in one outcome below it (conservation is tested).  The loader reads the
 * names from this enum: add new ones before MRC_COUNTER_MAX.
 */
enum mrc_counter {
	/* TX, TC egress */
	MRC_TX_SEEN,
	MRC_TX_ENCAP,			/* outcome: encapsulated and sent */
	MRC_TX_PASS,			/* outcome: not for a peer, untouched */
	MRC_TX_DROP_TOO_BIG,		/* outcome: would not fit the MTU */
	MRC_TX_DROP_NO_PATH,		/* outcome: peer without usable path */
	MRC_TX_DROP_ENCAP_FAIL,		/* outcome: the kernel refused the room */
	MRC_TX_ENCAP_BYTES,		/* bytes of encapsulated packets (outer) */
	MRC_TX_REDIRECT,		/* encapsulated, sent to the path's own next hop */
	/* RX, XDP */
	MRC_RX_SEEN,
	MRC_RX_DECAP,			/* outcome: valid, decapsulated, passed up */
	MRC_RX_PASS,			/* outcome: not for our SID, untouched */
	MRC_RX_DROP_TRUNCATED,		/* outcome: frame shorter than its headers */
	MRC_RX_DROP_PAYLOAD_LEN,	/* outcome: outer payload length != frame */
	MRC_RX_DROP_ROUTING_TYPE,	/* outcome: routing header is not an SRH */
	MRC_RX_DROP_SRH_LEN,		/* outcome: hdr_ext_len vs last_entry/packet */
	MRC_RX_DROP_SEGMENTS_LEFT,	/* outcome: segments left > last entry or > 0 */
	MRC_RX_DROP_ACTIVE_SEGMENT,	/* outcome: DA is not segment list[SL] */
	MRC_RX_DROP_TLV,		/* outcome: a TLV overruns the SRH */
	MRC_RX_DROP_MRC_TLV,		/* outcome: MRC TLV of wrong length/version */
	MRC_RX_DROP_INNER_PROTO,	/* outcome: next header not IPv6/IPv4 */
	MRC_RX_DROP_INNER_HEADER,	/* outcome: inner header cut or inconsistent */
	MRC_RX_DROP_DECAP_FAIL,		/* outcome: the kernel refused adjust_head */
	MRC_RX_DECAP_BYTES,		/* bytes of inner packets passed up */
	MRC_RX_MRC_TLV,			/* decapsulated packets that carried MRC TLV */
	MRC_RX_FEEDBACK,		/* feedback filed in path_health */
	MRC_RX_CONTROL,			/* outcome: feedback-only packet, consumed */
	MRC_TX_PROBE,			/* sent on a down path to test it */
	MRC_TX_REROUTE,			/* chosen path was down: another one taken */
	MRC_TX_FAIL_OPEN,		/* every path down: sent on a probed one anyway */
	MRC_TX_CONTROL,			/* outcome: feedback-only packet made and sent */
	MRC_FB_CLONE,			/* RX: a packet cloned to carry feedback back */
	MRC_RX_DROP_OPTION,		/* outcome: Destination Options header malformed,
					 * or an option we must not skip */
	MRC_TX_PINNED_PROBE,		/* sent on the path mrcctl probe named (SO_MARK) */
	MRC_TX_PROBE_COPY,		/* a header-only copy of a data packet tested a down path */
	MRC_RX_CE,			/* a fabric queue's CE mark carried to the inner header */
	MRC_RX_DROP_ECN,		/* outcome: outer CE on a Not-ECT inner packet (RFC 6040) */
	MRC_RX_DROP_OUTER_HEADER,	/* outcome: outer version is not 6, or its source is multicast */
	MRC_TX_TCP_RETRANS,		/* a TCP segment with nothing new (lib/tcp_steer.h) */
	MRC_TX_RETRANS_STEERED,		/* ... moved to a path heard more recently */
	/* RX with a key (lib/auth.h): a TLV whose feedback and measurements
	 * were not filed, by reason (not outcomes: the inner packet goes on) */
	MRC_RX_AUTH_NO_MAC,		/* the sender sent no MAC (key_id 0) */
	MRC_RX_AUTH_UNKNOWN_KEY,	/* key_id is none of our keys */
	MRC_RX_AUTH_BAD_MAC,		/* the MAC does not verify */
	MRC_RX_AUTH_OLD_EPOCH,		/* epoch older than the sender's latest */
	MRC_RX_AUTH_REPLAY,		/* path_seq seen already, or behind the window */
	MRC_RX_EPOCH,			/* a sender's new epoch: its tracking restarted */
	MRC_RX_CONTROL_TC,		/* RX: control packets filed at TC ingress, not XDP (a clone
					 * bpf_clone_redirect made is skipped by generic XDP) */
	/* learnt state (peer_state, lib/peer_state.h): not outcomes */
	MRC_STATE_NEW,			/* TX found a peer's state new: its turns started at its offset */
	MRC_STATE_REMADE,		/* ... of which the peer had state before: evicted since */
	MRC_STATE_FAIL,			/* TX: none could be made (the LRU freed no element): dropped */
	MRC_TX_SKIP,			/* a turn skipped: the peer reported CE on its path */
	MRC_TX_PROBE_HELD,		/* of tx_probe: a probe copy the probe budget held back, not sent */
	MRC_RX_FB_CE,			/* feedback said one of our paths was CE-marked */
	/* ---- issue 29 (trimming, port status) */
	MRC_RX_TRIMMED,			/* outcome: a trimmed packet (lib/trim.h): filed,
					 * answered at once, never delivered */
	MRC_FB_TRIM_CLONE,		/* RX: feedback cloned at once for a trimmed packet */
	MRC_RX_PORT_STATUS,		/* a peer's port status changed (lib/ports.h) */
	MRC_RX_PORT_DOWN_PATHS,		/* paths taken out because the peer's port of their plane is down */
	/* RoCEv2 (lib/roce.h): not outcomes */
	MRC_TX_ROCE,			/* a RoCEv2 packet encapsulated */
	MRC_TX_ROCE_RETRANS,		/* ... a request whose PSN was not new (go-back-N) */
	MRC_TX_ROCE_MOVE,		/* roce policy: a QP moved to another path */
	MRC_RX_ROCE,			/* a RoCEv2 packet decapsulated */
	MRC_RX_ROCE_NAK_SEQ,		/* ... a NAK, PSN sequence error */
	MRC_RX_ROCE_AHEAD,		/* ... a request ahead of the PSN expected */
	MRC_RX_SEGMENT,			/* a later wire segment of a burst (its TLV copied by
					 * segmentation): counted on its path, not filed again */
	/* the receiver's state (rx_peers, rx_paths: LRUs, lib/rx_track.h):
	 * not outcomes; made minus held is what the LRU evicted */
	MRC_RX_SENDER_NEW,		/* a sender's entry made: its first packet, or heard again after eviction */
	MRC_RX_SENDER_FAIL,		/* ... none could be made: the packet's news not filed */
	MRC_RX_PATH_NEW,		/* a (sender, path) entry made: its sequence starts afresh */
	MRC_FB_PORT_TELL,		/* RX: feedback cloned to a peer to tell it our port
					 * status changed (lib/port_tell.h) */
	MRC_COUNTER_MAX,
};

#endif /* MRC_COMMON_COUNTERS_H */
