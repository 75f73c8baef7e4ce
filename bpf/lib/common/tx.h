/* SPDX-License-Identifier: GPL-2.0 */
/* TX's own bookkeeping: TCP flows' progress, the header scratch room.
 * Part of mrc_common.h (read by mrc_ebpf/datapath/source.py). */
#ifndef MRC_COMMON_TX_H
#define MRC_COMMON_TX_H

/* tx_flows: array by a TCP flow's hash (direct-mapped): how far each flow
 * has sent, so that TX tells a retransmission from new data */
#define MRC_TX_FLOWS		4096	/* a power of two */
struct mrc_tx_flow {
	__u32	key;		/* its addresses and ports folded; one flow per slot */
	__u32	snd_nxt;	/* one past the highest sequence number it sent */
};

/* tx_scratch: per-CPU array of one, where mrc_tx builds the headers it
 * writes (outer IPv6 and the TLV), which do not fit on its 512-byte stack
 * beside everything else */
struct mrc_tx_scratch {
	__u8	bytes[128] __attribute__((aligned(8)));	/* zeroed a word at a time */
};

#endif /* MRC_COMMON_TX_H */
