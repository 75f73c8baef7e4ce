/* SPDX-License-Identifier: GPL-2.0 */
/* RoCEv2 over MRC paths (issue 32). */
#ifndef MRC_COMMON_ROCE_H
#define MRC_COMMON_ROCE_H

/* ---- RoCEv2 (lib/roce.h) --------------------------------------------- */
/*
 * A RoCEv2 packet is UDP to port 4791 with an InfiniBand Base Transport
 * Header (BTH) after the UDP header.  A queue pair (QP) is known here by
 * its peer and the UDP source port: RoCEv2 senders (rxe, and NICs through
 * rdma_get_udp_sport) derive it from the product of the two QP numbers
 * when no flow label is set, so the requests of a reliably connected QP
 * and the ACKs its responder sends back carry the same port.
 */
#define MRC_ROCE_PORT		4791
#define MRC_ROCE_QPS		1024	/* QPs tracked (LRU; memlock: docs/design/roce.md) */
#define MRC_ROCE_PATHS		1024	/* (peer, path, side) rows of RoCE counters (LRU) */
#define MRC_ROCE_TURNS		1024	/* per-peer QP counters, by peer_id mod this (a power of two) */
#define MRC_ROCE_PSN_MASK	0xffffff

struct mrc_roce_key {
	__u32	peer_id;
	__u16	sport;		/* the QP pair's UDP source port */
	__u16	pad;
};

/* mrc_roce_qp.flags */
#define MRC_ROCE_F_SENT		0x01	/* last_psn holds a request we sent */
#define MRC_ROCE_F_ACKED	0x02	/* acked_psn holds an ACK we received */
#define MRC_ROCE_F_RX		0x04	/* rx_next_psn holds the next request PSN expected */
#define MRC_ROCE_F_PLACED	0x08	/* roce policy: turn and pos are set */

/* roce_qps: LRU hash, mrc_roce_key -> one QP's RoCE state and counters.
 * TX side for the QPs we are requester of, RX side for those we answer. */
struct mrc_roce_qp {
	__u64	tx_packets;	/* RoCE packets of it we sent */
	__u64	tx_retrans;	/* requests sent whose PSN was not new: the requester went back */
	__u64	naks_seq;	/* NAK (PSN sequence error) its responder sent us */
	__u64	acks;		/* ACKs (and other AETH-carrying responses) received */
	__u64	rx_packets;	/* requests received (we are its responder) */
	__u64	rx_ahead;	/* requests that arrived ahead of the next PSN expected (a gap) */
	__u64	rx_behind;	/* requests behind it: retransmitted or late */
	__u32	dqpn;		/* destination QP of its latest request or ACK */
	__u32	last_psn;	/* TX: the latest request PSN sent */
	__u32	acked_psn;	/* RX: the latest PSN its responder acknowledged */
	__u32	rx_next_psn;	/* RX: the next request PSN expected */
	__u32	turn;		/* roce policy: its place in the peer's spread */
	__u32	moves;		/* roce policy: times it changed path */
	__u16	path_id;	/* TX: the path of its latest packet */
	__u16	pos;		/* roce policy: its position in the spray list */
	__u8	flags;		/* MRC_ROCE_F_* */
	__u8	pad[3];
};

/* roce_paths: LRU hash, (peer, path, side) -> RoCE counters of a path.
 * Side 0: our path to the peer (what we sent on it and the NAKs its QPs
 * drew); side 1: the peer's path to us, by the id its TLV gives. */
struct mrc_roce_path_key {
	__u32	peer_id;
	__u16	path_id;
	__u16	side;
};

struct mrc_roce_path {
	__u64	tx_packets;
	__u64	tx_retrans;
	__u64	naks_seq;
	__u64	rx_packets;
	__u64	rx_ahead;
	__u64	rx_behind;
};

/* roce_pkt: per-CPU array of one: what mrc_tx read of a RoCE packet's
 * BTH before its path choice, for after it (mrc_tx has no stack left) */
struct mrc_roce_pkt {
	__u32	psn;
	__u32	dqpn;
	__u16	sport;
	__u8	opcode;
	__u8	syndrome;	/* the AETH's, for opcodes that carry one */
	__u32	valid;		/* TX: 1 while the packet in hand is RoCE */
	/* TX, what the policy's turn is (lib/path_select.h): list position
	 * (peer_seq * seq_mul + pos) mod the list's length: round robin
	 * (1, 0) for any packet but a QP's under the roce policy (0, its
	 * position).  Numbers, not a branch: mrc_tx's verifier budget. */
	__u32	seq_mul;
	__u32	pos;
};

#endif
