/* SPDX-License-Identifier: GPL-2.0 */
/* The wire format: the MRC TLV in the SRH, and its uSID form in a
 * Destination Options header.
 * Part of mrc_common.h (read by mrc_ebpf/datapath/source.py). */
#ifndef MRC_COMMON_WIRE_H
#define MRC_COMMON_WIRE_H

/* ---- the MRC TLV, carried in the SRH (RFC 8754 section 2.1) ----------- */
/*
 * Type 124 is from the "Experimentation and Test" range of IANA's
 * "Segment Routing Header TLVs" registry (124-126).  Its high bit is
 * clear: the value does not change en route.
 */
#define MRC_TLV_TYPE		124
#define MRC_VERSION		1
#define MRC_TLV_SIZE		64	/* whole TLV: keeps the SRH 8-byte aligned */
#define MRC_TLV_LEN		(MRC_TLV_SIZE - 2)	/* the TLV's length field */

/* mrc_tlv.flags */
#define MRC_F_PROBE		0x01	/* sent to test a path, not data */
#define MRC_F_FEEDBACK		0x02	/* the fb_* fields report on one of the peer's paths */
#define MRC_F_CONTROL		0x04	/* feedback only: the receiver consumes it */
/* with MRC_F_FEEDBACK: a packet on the path fb_path_id arrived CE-marked
 * (outer ECN) since that path was last reported so: the fabric's queues
 * on it are filling.  The sender skips the path for a while (struct
 * mrc_path_live.skip); congestion, never a failure. */
#define MRC_F_FB_CE		0x08

struct mrc_tlv {
	__u8	type;		/* MRC_TLV_TYPE */
	__u8	len;		/* MRC_TLV_LEN */
	__u8	version;	/* MRC_VERSION */
	__u8	flags;		/* MRC_F_* */
	__be16	path_id;	/* index of the path in the sender's set */
	__u8	tclass;		/* traffic class the packet was sent in */
	__u8	fb_block;	/* fb_heard covers path ids 64*fb_block .. +63 */
	__be32	path_seq;	/* per (peer, path): a gap is a loss on that path */
	__be32	peer_seq;	/* per peer, across paths: gives reordering */
	__be64	tx_ns;		/* sender's CLOCK_MONOTONIC at encap */
	/* Feedback, piggybacked: how the path fb_path_id of the packets the
	 * receiver of this one sends us is doing, as we measured it. */
	__be16	fb_path_id;
	__be16	fb_qdelay_us;	/* queueing delay (one-way delay above its minimum) */
	__be32	fb_lost;	/* packets lost on that path so far (gaps not filled late) */
	__be64	fb_heard;	/* bit i: we heard from path 64*fb_block+i since we last said */
	/* ...and the newest packet heard on each path in fb_heard was
	 * stamped by its sender (tx_ns, low 32 bits) at or after this: an
	 * acknowledgement in the sender's own clock, so it can tell which of
	 * its sends arrived */
	__be32	fb_since_ns32;
	/* exactly: the newest packet heard on fb_path_id was stamped this */
	__be32	fb_path_tx32;
	/* The sender's epoch (struct mrc_auth): a new one tells the peer the
	 * sender restarted and its sequence numbers begin again. */
	__be32	epoch;
	__u8	key_id;		/* key the MAC is made with; 0: no MAC */
	/* the sender's port status (issue 29's block, at the end): bit i,
	 * its attachment's device i (plane i) is down */
	__u8	ports_down;
	__u8	reserved[2];	/* zero */
	/* SipHash-2-4 under key key_id of the final destination, the outer
	 * source and this TLV's fields (lib/auth.h gives the order); zero
	 * when key_id is 0 */
	__u8	mac[8];
} __attribute__((packed, aligned(8)));	/* every field is at its natural
					 * offset: aligned, so that clang writes and reads
					 * it a word at a time, not a byte at a time */

/* the bytes of the TLV that the MAC covers: from flags (byte 3; type,
 * length and version are checked for their exact values) to mac[], the
 * feedback words (MRC_TLV_FB_OFF..MRC_TLV_EPOCH_OFF) only when the TLV
 * says it carries feedback (MRC_F_FEEDBACK): a receiver reads them only
 * then */
#define MRC_TLV_MAC_OFF		(MRC_TLV_SIZE - 8)
#define MRC_TLV_FB_OFF		24	/* fb_path_id: the feedback words begin */
#define MRC_TLV_EPOCH_OFF	48	/* epoch, key_id, reserved: one word */

/* SRH fixed part (8) + segment list + MRC TLV */
#define MRC_SRH_LEN(nseg)	(8 + 16 * (nseg) + MRC_TLV_SIZE)
/* what encapsulation adds to each packet: outer IPv6 + SRH */
#define MRC_ENCAP_LEN(nseg)	(40 + MRC_SRH_LEN(nseg))

/* ---- compressed SRv6 (uSID, NEXT-C-SID of RFC 9800) ------------------- */
/*
 * The whole path is the outer destination: a 32-bit locator block, then
 * one 16-bit ID per hop, zeros after the last.  Each switch's End with
 * the next-csid flavor shifts the next ID into place; the host whose ID
 * is last decapsulates.  No SRH: the MRC TLV rides, with the same layout,
 * as an option of a Destination Options header (RFC 8200 section 4.6),
 * whose type is from the experimental range of RFC 4727: 0x1E, action
 * bits 00 (skip if unknown), change bit 0 (not changed en route).
 */
#define MRC_USID_BLOCK_BITS	32
#define MRC_USID_ID_BITS	16
#define MRC_OPT_TYPE		0x1E
#define MRC_OPT_PADN		1	/* PadN option type */
/* Destination Options: next header, length, MRC option, PadN to 8 bytes */
#define MRC_DOH_LEN		(2 + MRC_TLV_SIZE + 6)
#define MRC_USID_ENCAP_LEN	(40 + MRC_DOH_LEN)

#define MRC_HOP_LIMIT		64

#endif /* MRC_COMMON_WIRE_H */
