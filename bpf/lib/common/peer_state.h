/* SPDX-License-Identifier: GPL-2.0 */
/* peer_state: what the datapath learns about a peer and its paths.
 * Part of mrc_common.h (read by mrc_ebpf/datapath/source.py). */
#ifndef MRC_COMMON_PEER_STATE_H
#define MRC_COMMON_PEER_STATE_H

#include "sizes.h"
#include "paths.h"
#include "auth.h"

/*
 * peer_acks: in peer_state: for each of our paths, the send time (our
 * clock) from which on the peer has heard a packet of it.  Each feedback
 * acknowledges a few paths of one block of 64 path ids (the receiver
 * rotates over the blocks with news, lib/feedback.h); filing is one store
 * per bit, and the TX side reads one entry when it checks a path.  A peer
 * that never sent feedback (no mrc-ebpf there, e.g. the kernel's own
 * End.DT6) has no acknowledgement clock: its paths never time out.
 */
struct mrc_peer_acks {
	__u64	ns[MRC_MAX_PATHS];	/* a packet sent at or after this arrived */
	__u64	max_ns;		/* the latest of ns[]: how far the peer has heard us */
	__u64	last_ns;	/* any feedback from this peer (0: never: no failover) */
	/* The window learnt from late packets, as RACK learns its reordering
	 * window from spurious retransmissions: a path taken down whose
	 * packets from before the down are then acknowledged was late, not
	 * dead, so the peer's paths differ in delay by more than the window.
	 * 0: ack_timeout as configured.  Never above reorder_max_us. */
	__u64	window_ns;
	__u64	window_hold_ns;	/* until then window_ns holds, then halves */
};

/* fb_due: in peer_state, set by RX when the peer is owed feedback and
 * no packet of ours has carried it lately (one-way traffic). */

/* peer_tx: in peer_state; updated with atomic adds, shared by CPUs */
struct mrc_peer_tx {
	__u64	seq;		/* next per-peer sequence number */
	__u64	bytes;		/* bytes policy: bytes sprayed so far (all classes) */
	__u64	fail_open_ns;	/* since when every path is down (0: not) */
	/* The path with the newest acknowledgement TX has seen while choosing
	 * paths, and that acknowledgement: where a TCP retransmission goes
	 * (lib/tcp_steer.h) */
	__u64	heard_ns;
	__u32	heard_path;
	__u32	pad;
};

/*
 * peer_state: LRU hash, peer_id -> everything the datapath learns about a
 * peer and its paths, created (zeroed) by the peer's first packet either
 * way and evicted when idle, so memory follows the peers in use, not the
 * peers configured.  One lookup per packet; a path's part is reached by a
 * masked index inside the value (lib/peer_state.h).  The counters in it
 * are atomic adds shared by CPUs (next to the sequence number the packet
 * takes anyway), not per-CPU copies of every path.
 */
#define MRC_MAX_ACTIVE_PEERS	256	/* peers with learnt state at once */

/*
 * A peer without learnt state (never sent to, or evicted from the LRU)
 * starts its turns at an offset of its own, not at path 0
 * (lib/peer_state.h, peer_state_turn): its id spread by Fibonacci hashing
 * plus how often its state started before, counted in peer_starts (by
 * peer_id mod MRC_PEER_STARTS; 16 bits, four to a word), so peers that keep
 * losing their state still spray over all their paths, and a new state of
 * a peer that had one is counted as made again (MRC_STATE_REMADE).  An
 * LRU insert fails only when no element can be freed for it (not for
 * being full: the oldest is evicted): such a packet is counted
 * (MRC_STATE_FAIL) and dropped as before (MRC_TX_DROP_NO_PATH).
 */
#define MRC_PEER_STARTS		262144	/* a power of two */

struct mrc_path_state {
	struct mrc_path_live	live;
	struct mrc_path_health	health;
	__u64	seq;		/* next per-path sequence number (atomic: no gaps) */
	__u64	tx_packets;
	__u64	tx_bytes;
	/* shared fate: the probe copy sent for its hop's suspicion; 0: none */
	__u64	fate_probe_ns;
};

struct mrc_peer_state {
	struct mrc_peer_tx	tx;
	struct mrc_peer_acks	acks;
	__u64	fb_due;		/* RX: the peer is owed feedback (see fb_due below) */
	__u64	floor_out;	/* paths taken out by the datapath (lib/floor.h) */
	/* the peer's row in paths (its template_id) + 1, written by TX when
	 * its state is new; 0: not known yet (its own: peer_id).  RX walks
	 * the row on a port status (lib/ports.h) */
	__u32	row1;
	__u32	pad;
	struct mrc_mac_prefix	tx_mac;	/* the MAC's state for what we send it */
	struct mrc_path_state	paths[MRC_MAX_PATHS];
};

#endif /* MRC_COMMON_PEER_STATE_H */
