/* SPDX-License-Identifier: GPL-2.0 */
/* peer_state: what the datapath learns about a peer and its paths.
 * Part of mrc_common.h (read by mrc_ebpf/datapath/source.py). */
#ifndef MRC_COMMON_PEER_STATE_H
#define MRC_COMMON_PEER_STATE_H

#include "sizes.h"
#include "paths.h"
#include "auth.h"

/*
 * peer_acks: in peer_state: for each of our paths (path_clock.acked_ns),
 * the send time (our clock) from which on the peer has heard a packet of it.  Each feedback
 * acknowledges a few paths of one block of 64 path ids (the receiver
 * rotates over the blocks with news, lib/feedback.h); filing is one store
 * per bit, and the TX side reads one entry when it checks a path.  A peer
 * that never sent feedback (no mrc-ebpf there, e.g. the kernel's own
 * End.DT6) has no acknowledgement clock: its paths never time out.
 */
struct mrc_peer_acks {
	/* per path: in struct mrc_path_clock (acked_ns), beside its clock */
	__u64	max_ns;		/* the latest of ns[]: how far the peer has heard us */
	__u64	last_ns;	/* any feedback from this peer (0: never: no failover) */
	/* The window learnt from late packets, as RACK learns its reordering
	 * window from spurious retransmissions: a path taken down whose
	 * packets from before the down are then acknowledged was late, not
	 * dead, so the peer's paths differ in delay by more than the window.
	 * 0: ack_timeout as configured.  Never above reorder_max_us. */
	__u64	window_ns;
	__u64	window_hold_ns;	/* until then window_ns holds, then halves */
	/* Our first send to the peer after a pause (none for more than
	 * reorder_max_us), and max_ns then: how far the peer had heard us before
	 * it (lib/failover.h, failover_lone) */
	__u64	resume_ns;
	__u64	max_at_resume_ns;
};

/* fb_due: in peer_state, set by RX when the peer is owed feedback and
 * no packet of ours has carried it lately (one-way traffic). */

/* peer_tx: in peer_state; updated with atomic adds, shared by CPUs */
struct mrc_peer_tx {
	__u64	seq;		/* next per-peer sequence number */
	/* bytes policy: turns taken so far (all classes), in 1/65536 of a
	 * turn: a packet advances it by its length over turn_len */
	__u64	turns_q16;
	__u64	fail_open_ns;	/* since when every path is down (0: not) */
	/* The path with the newest acknowledgement TX has seen while choosing
	 * paths, and that acknowledgement: where a TCP retransmission goes
	 * (lib/tcp_steer.h) */
	__u64	heard_ns;
	__u32	heard_path;
	/* bytes policy: a turn's length, the largest of the peer's recent
	 * packets (a maximum that decays by 1/64 a packet), at most the
	 * spray list's quantum (lib/path_select.h, path_select_byte_turn) */
	__u32	turn_len;
	__u64	last_ns;	/* our latest send to the peer, any path (a pause: failover_pause) */
};

/*
 * peer_state: LRU hash, peer_id -> what the datapath learns about a peer
 * (below), created (zeroed) by the peer's first packet either way and
 * evicted when idle, so memory follows the peers in use, not the peers
 * configured.  One lookup per packet, and one of its row's state (an
 * array); a path's part of either is reached by a masked index inside
 * the value (lib/peer_state.h).  Their counters are atomic adds shared
 * by CPUs (next to the sequence number the packet takes anyway), not
 * per-CPU copies of every path.
 */
/* 16,384 active peers at once, and room for the kernel's LRU: it evicts
 * in batches and parks free entries per CPU (up to 128 each), so an LRU
 * of exactly 16,384 thrashed under 16,384 peers sent to in turn (a new
 * state for almost every packet; bench active-peers) */
#define MRC_MAX_ACTIVE_PEERS	18432	/* entries of learnt state */

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

/*
 * What is learnt is split by whom it is about (docs/design/scale.md):
 *
 * - about a path: whether it is up, skipped, probed, its health and its
 *   counters, in the row state of the path's row (struct mrc_row_state:
 *   a template's, shared by its peers, or a peer's own).  A spine that
 *   fails fails for every peer behind the leaf; one peer's evidence
 *   takes the path out for all of them, and one probe brings it back.
 * - about a peer: its sequence numbers, what it has acknowledged and
 *   what it owes, in its peer state (LRU).  A path's acknowledgement
 *   clock is per peer: peers report at different times, and one peer's
 *   acknowledgement of a later send says nothing of another peer's
 *   earlier one (the same rule as shared fate's watches).
 *
 * So learnt state for MRC_MAX_ACTIVE_PEERS peers at once is about 7 KB a
 * peer, not the 35 KB it took when everything was per peer.
 */

/* per (peer, path): the acknowledgement clock of our sends to the peer */
struct mrc_path_clock {
	__u64	acked_ns;		/* a packet sent at or after this arrived (peer_acks) */
	__u64	unacked_since_ns;	/* oldest send not yet acknowledged; 0: none */
	/* The peer's acknowledgement of a path is often a lower bound (the
	 * oldest of the paths a report covers), below the very send it
	 * acknowledges.  What it proves is "a packet sent after this
	 * arrived": so the clock keeps the row's send that came just before
	 * unacked_since (any peer's: a later one than this peer's own, so a
	 * stricter test), and an acknowledgement past that one counts. */
	__u64	clock_after_ns;
};

struct mrc_peer_state {
	struct mrc_peer_tx	tx;
	struct mrc_peer_acks	acks;
	__u64	fb_due;		/* RX: the peer is owed feedback (see fb_due below) */
	/* the peer's row in paths (its template_id) + 1, written by TX when
	 * its state is new; 0: not known yet (its own: peer_id).  RX files
	 * feedback into that row's state and walks it on a port status */
	__u32	row1;
	__u32	pad;
	struct mrc_mac_prefix	tx_mac;	/* the MAC's state for what we send it */
	struct mrc_path_clock	clocks[MRC_MAX_PATHS];
	/* the next per-path sequence number (atomic: no gaps), two paths'
	 * 32-bit numbers a word (a 32-bit fetch-and-add needs ALU32) */
	__u64	path_seq[MRC_MAX_PATHS / 2];
};

/* per (row, path): what is learnt about the path itself */
struct mrc_path_state {
	struct mrc_path_live	live;
	struct mrc_path_health	health;
	__u64	heard_ns;	/* the newest send any peer acknowledged exactly */
	__u64	tx_packets;
	__u64	tx_bytes;
	/* shared fate: the probe copy sent for its hop's suspicion; 0: none */
	__u64	fate_probe_ns;
};

/*
 * row_state: array, a row of paths (MRC_MAX_PEERS: a template's or an
 * own-path peer's) -> what is learnt about its paths.  Zeroed by the
 * control plane when the row is given to a new peer or template
 * (control/peer_table.py, forget_row).
 */
struct mrc_row_state {
	__u64	floor_out;	/* paths taken out by the datapath (lib/floor.h) */
	__u64	pad;
	struct mrc_path_state	paths[MRC_MAX_PATHS];
};

#endif /* MRC_COMMON_PEER_STATE_H */
