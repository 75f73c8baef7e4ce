/* SPDX-License-Identifier: GPL-2.0 */
/* What the receiver tracks per sender and per path.
 * Part of mrc_common.h (read by mrc_ebpf/datapath/source.py). */
#ifndef MRC_COMMON_RX_H
#define MRC_COMMON_RX_H

#include "sizes.h"

/*
 * rx_paths: LRU hash, (sender SID, path id) -> what the receiver saw on
 * that path.  Packets on one path arrive in order, so a gap in path_seq
 * is a loss on that path.  Bounded (MRC_RX_MAX_PATHS pairs, fewer than
 * 16,384 senders x 256 paths): a pair evicted and heard again starts
 * afresh, as a sender's new epoch does: its sequence restarts at that
 * packet (no loss, no late), its delay baseline too, and its newest send
 * is unknown (docs/design/scale.md, "The receive side").
 */
struct mrc_rx_key {
	__u8	sid[16];	/* the sender's SID (outer source) */
	__u16	path_id;
	__u16	pad;
};

struct mrc_rx_path {
	__u64	packets;
	__u64	bytes;
	__u64	lost;		/* sequence numbers skipped */
	__u64	late;		/* arrived behind the path's next expected number */
	__u64	min_owd_ns;	/* smallest one-way delay seen (clock offset included) */
	__u64	last_ns;	/* arrival time of the latest packet */
	__u32	next_seq;	/* next path_seq expected */
	__u32	qdelay_us;	/* moving average of one-way delay above the minimum */
	__u32	qdelay_hist[MRC_HIST_BUCKETS];	/* log2 microseconds */
	/* the sender's epoch next_seq belongs to: another one restarts the
	 * path's sequence (and delay baseline) instead of counting late */
	__u32	epoch;
	__u32	ce;		/* packets that arrived with outer CE (a fabric queue marked them) */
	/* bit i: path_seq next_seq - 2 - i arrived (the replay window of an
	 * authenticated sender: a number arrives once; next_seq - 1 did) */
	__u64	seen;
	__u32	trimmed;	/* packets that arrived trimmed (lib/trim.h): not lost, not delivered */
	__u32	pad2;
	/* the sum of what qdelay_hist counts (microseconds): the exporter's
	 * histogram _sum (the buckets alone cannot give it) */
	__u64	qdelay_sum_us;
	/* the newest sender tx_ns that arrived on the path: the send before
	 * a packet (lib/rx_track.h, rx_track_heard) and a report's exact
	 * time (lib/feedback.h).  Here, not per sender: 8 B a pair that is
	 * looked up anyway, where a per-sender array of 256 was 2 KB of
	 * every sender's entry */
	__u64	latest_tx;
};

/*
 * rx_peers: LRU hash, sender SID -> reordering across that sender's paths,
 * and which path to report on in our next feedback to it.  A sender
 * forgotten (evicted) is not acknowledged for what it sent before, so
 * the map holds every sender of an all-to-all at once: 16,384 active
 * senders, and room for the kernel's LRU as peer_state has (it evicts in
 * batches and parks free entries per CPU).  312 B an entry.
 */
#define MRC_RX_MAX_SENDERS	18432
struct mrc_rx_peer {
	__u64	packets;
	__u64	reordered;	/* arrived with peer_seq below the highest seen */
	__u64	heard[MRC_MAX_PATHS / 64];	/* paths heard from, not yet reported */
	__u64	loss_news[MRC_MAX_PATHS / 64];	/* paths with a loss not yet reported */
	__u64	ce_news[MRC_MAX_PATHS / 64];	/* paths with a CE mark not yet reported */
	__u64	fb_sent_ns;	/* when our last feedback to this sender left */
	__u32	max_peer_seq;
	__u16	last_path_id;	/* reported in feedback when nothing is new */
	__u8	fb_block;	/* next block of `heard` to report */
	__u8	ports_down;	/* planes filed down for it: its port status | ours (lib/ports.h) */
	__u32	reorder_hist[MRC_HIST_BUCKETS];	/* log2 of (highest - peer_seq) */
	__u32	epoch;		/* the sender's latest epoch (lib/auth.h) */
	__u32	restarts;	/* times its epoch changed: it re-attached */
	/* Per block of `heard`: every path in it has sent a packet at or
	 * after heard_since that arrived (the report's lower bound), and the
	 * newest send before that on any of them is heard_need, which the
	 * bound must stay above to acknowledge it (lib/rx_track.h,
	 * rx_track_heard; reported by lib/feedback.h). */
	__u64	heard_since[MRC_MAX_PATHS / 64];
	__u64	heard_need[MRC_MAX_PATHS / 64];
	/* paths heard whose send would drag the bound below heard_need:
	 * reported exactly, one per report */
	__u64	heard_slow[MRC_MAX_PATHS / 64];
	/* a walk of our paths for the sender's port status, under way over
	 * several packets (lib/ports.h); 0: none */
	__u32	ports_walk;
	__u8	ports_told;	/* our port status when feedback was last owed it (lib/feedback.h) */
	__u8	pad3[3];
	__u64	reorder_sum;	/* the sum of what reorder_hist counts (packets) */
};

#endif /* MRC_COMMON_RX_H */
