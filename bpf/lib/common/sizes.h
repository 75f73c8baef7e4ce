/* SPDX-License-Identifier: GPL-2.0 */
/* Sizes of the maps and lists, and the skb marks the datapath gives packets.
 * Part of mrc_common.h (read by mrc_ebpf/datapath/source.py). */
#ifndef MRC_COMMON_SIZES_H
#define MRC_COMMON_SIZES_H

/* ---- sizes ------------------------------------------------------------ */
#define MRC_MAX_PEERS		256	/* rows of paths: own-path peers plus path templates */
#define MRC_MAX_PATHS		256	/* paths per peer (path ids 0..255) */
#define MRC_MAX_SEGMENTS	6	/* SIDs in one path's segment list */
#define MRC_MAX_TLVS		16	/* TLVs the receiver walks per SRH */
#define MRC_MAX_CLASSES		8	/* traffic classes; 0 is the default class */
#define MRC_SPRAY_SLOTS		1024	/* entries of one spray list */
#define MRC_RX_MAX_PATHS	65536	/* (sender, path) pairs the receiver tracks */
#define MRC_HIST_BUCKETS	16	/* log2 buckets of the receiver's histograms */
#define MRC_REROUTE_TRIES	4	/* other list entries tried when a path is down */
#define MRC_SILENCE_FACTOR	16	/* feedback without this path: down after this x ack_timeout */
/* A peer's widened acknowledgement window halves after this long without
 * a late packet (see struct mrc_peer_acks) */
#define MRC_REORDER_HOLD_NS	1000000000ULL
/* path_health.ce_stamp's unit: 2^20 ns (1.05 ms), 16 bits wrap in 68.7 s */
#define MRC_CE_STAMP_SHIFT	20
#define MRC_FB_MARK		0x4d524346	/* skb->mark of a clone that becomes feedback */
#define MRC_MAX_DEVICES		8	/* devices (planes) one attachment spans */
/* skb->mark of a packet `mrcctl probe` sends on one chosen path:
 * MRC_PROBE_MARK | path id (the low 8 bits; MRC_MAX_PATHS is 256) */
#define MRC_PROBE_MARK		0x4d525000
#define MRC_PROBE_MARK_MASK	0xffffff00
/* skb->mark of the header-only copy of a data packet that mrc_tx sends
 * to test a down path, while the packet itself takes a live one:
 * MRC_PROBE_COPY_MARK | path id (under MRC_PROBE_MARK_MASK) */
#define MRC_PROBE_COPY_MARK	0x4d525100

#endif /* MRC_COMMON_SIZES_H */
