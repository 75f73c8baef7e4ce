/* SPDX-License-Identifier: GPL-2.0 */
/* Authenticated feedback: the keys and the MAC's reusable state.
 * Part of mrc_common.h (read by mrc_ebpf/datapath/source.py). */
#ifndef MRC_COMMON_AUTH_H
#define MRC_COMMON_AUTH_H

/* ---- authenticated feedback (lib/auth.h) ---------------------------- */
/*
 * auth: array of one, written by the loader.  A host with keys signs
 * every TLV it sends with keys[tx_slot - 1] and files a peer's TLV
 * (feedback, measurements) only when it carries a MAC made with one of
 * its keys and is fresh: two keys, so a fabric can roll to a new key
 * host by host.  Without keys, TLVs go out unsigned and are all filed.
 */
#define MRC_AUTH_KEYS		2
#define MRC_AUTH_REPLAY_WINDOW	64	/* path_seq numbers behind the newest that may arrive */

struct mrc_auth_key {
	__u64	k0;		/* SipHash key: bytes 0-7 of the 16, little-endian */
	__u64	k1;		/* bytes 8-15 */
	__u8	id;		/* sent as mrc_tlv.key_id; 0: slot empty */
	__u8	pad[7];
};

struct mrc_auth {
	/* set at attach, from CLOCK_REALTIME in 2^-10 s: a later attach has
	 * a later epoch (compared modulo 2^32) */
	__u32	epoch;
	__u8	tx_slot;	/* 1 + the slot of keys[] we sign with; 0: none */
	__u8	pad[3];
	struct mrc_auth_key keys[MRC_AUTH_KEYS];
};

/*
 * SipHash-2-4's state after the words of the MAC's message that do not
 * change from packet to packet (lib/auth.h): both SIDs and the sender's
 * epoch word.  TX keeps one per peer (mrc_peer_state.tx_mac), RX one per
 * sender in auth_rx_prefix, an array by a hash of the sender's SID
 * (direct-mapped: a sender whose slot another took gets its own back at
 * its next authentic packet).  Made by the datapath when a packet finds
 * none for its key and words, then reused.  Our own SID is the same for
 * the attachment's life.
 */
#define MRC_AUTH_RX_SENDERS	1024	/* a power of two */

struct mrc_mac_prefix {
	__u64	k0, k1;		/* the key it was made with */
	__u64	words[3];	/* TX: the peer SID's two words and the epoch word;
				 * RX: the sender SID's and the epoch word */
	__u64	v[4];		/* the state */
	__u64	check;		/* XOR of the nine words above: an entry that two
				 * CPUs wrote at once, with different keys, fails it */
};

#endif /* MRC_COMMON_AUTH_H */
