/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Learnt state: a peer's (struct mrc_peer_state in the peer_state LRU)
 * and its row's (struct mrc_row_state, an array): one lookup of each per
 * packet, then each path's part by a masked index.  Every access to
 * learnt state goes through these, so the layout can change in one
 * place.
 */
#ifndef MRC_LIB_PEER_STATE_H
#define MRC_LIB_PEER_STATE_H

#include "lib/maps.h"
#include "lib/compiler.h"
#include "lib/counters.h"

/* The peer's state if it has any (mrc_fb: a peer without any is owed
 * nothing). */
static __always_inline struct mrc_peer_state *peer_state_find(__u32 peer_id)
{
	return mrc_peer_state.lookup(&peer_id);
}

/* The peer's state, created zeroed by its first packet either way: sent
 * to it (TX), or feedback or data from it (RX; configured peers only).
 * NULL when the LRU could make none (TX counts it: MRC_STATE_FAIL). */
static __always_inline struct mrc_peer_state *peer_state_get(__u32 peer_id)
{
	struct mrc_peer_state *st = mrc_peer_state.lookup(&peer_id);
	__u32 zero = 0;

	if (st)
		return st;
	st = mrc_peer_state_zero.lookup(&zero);
	if (!st)
		return NULL;
	/* NOEXIST: another CPU may have created it meanwhile; keep that one */
	mrc_peer_state.insert(&peer_id, st);
	return mrc_peer_state.lookup(&peer_id);
}

/*
 * The turn a packet takes, from the number it took from the peer's
 * sequence (`seq`, fetched and incremented): the same, unless the state
 * is new (seq 0: made by this packet, or by RX, for a peer never sent to
 * or evicted since).  Then not 0, which every peer losing its state in
 * turn would take (with more peers than the LRU holds, every packet went
 * on path 0), but the peer's own offset, its id spread over the n turns
 * by Fibonacci hashing (consecutive ids land about n * 0.618 apart: the
 * peers of a template start on different paths), plus the number of
 * times its state started before (peer_starts): a peer that loses its
 * state at every packet still takes its turns in order, n packets over n
 * paths.  The peer's sequence (and bytes' turns) move on from there.
 * Counted: MRC_STATE_NEW, and MRC_STATE_REMADE when it had state before.
 * O(1): one array word, for a new state only.
 */
static __always_inline __u64 peer_state_turn(struct mrc_peer_state *st, __u64 seq, __u32 peer_id,
					     __u32 n, __u32 row)
{
	__u32 slot = peer_id & (MRC_PEER_STARTS - 1), word = slot / 4, shift = (slot % 4) * 16;
	__u64 *starts, first;
	__u32 k;

	if (seq)
		return seq;
	st->row1 = row + 1;	/* for RX's port status (lib/ports.h) */
	starts = mrc_peer_starts.lookup(&word);
	if (!starts)
		return seq;
	/* four peers' 16-bit counts a word (an array's values take 8 bytes
	 * each); the wrap of one carries into the next, once in 65,536 */
	k = (__sync_fetch_and_add(starts, 1ULL << shift) >> shift) & 0xffff;
	count(MRC_STATE_NEW);
	if (k)
		count(MRC_STATE_REMADE);
	first = ((((__u64)(peer_id * 2654435769U) * n) >> 32) + k) % n;
	/* adds, not stores: another CPU may have taken a number meanwhile */
	__sync_fetch_and_add(&st->tx.seq, first);
	__sync_fetch_and_add(&st->tx.turns_q16, first << 16);
	return first;
}

/* The learnt state of a row's paths (a template's, or an own-path
 * peer's): an array entry, never missing for a row in range. */
static __always_inline struct mrc_row_state *row_state_get(__u32 row)
{
	return mrc_row_state.lookup(&row);
}

/* The row of a peer's state as TX last saw it (RX: where its feedback is
 * filed); its own row (peer_id) if TX never sent since the state was made. */
static __always_inline struct mrc_row_state *peer_row_state(const struct mrc_peer_state *st, __u32 peer_id)
{
	return row_state_get(st->row1 ? st->row1 - 1 : peer_id);
}

static __always_inline struct mrc_path_state *row_path(struct mrc_row_state *rs, __u32 path_id)
{
	barrier_var(path_id);
	return &rs->paths[path_id & (MRC_MAX_PATHS - 1)];
}

static __always_inline struct mrc_path_live *row_path_live(struct mrc_row_state *rs, __u32 path_id)
{
	return &row_path(rs, path_id)->live;
}

static __always_inline struct mrc_path_health *row_path_health(struct mrc_row_state *rs, __u32 path_id)
{
	return &row_path(rs, path_id)->health;
}

/* The peer's acknowledgement clock of our sends on path_id */
static __always_inline struct mrc_path_clock *peer_path_clock(struct mrc_peer_state *st, __u32 path_id)
{
	barrier_var(path_id);
	return &st->clocks[path_id & (MRC_MAX_PATHS - 1)];
}

/* Takes the next sequence number of our sends to the peer on path_id.
 * Two paths a word: the wrap of the low one carries into the high one,
 * one gap (a loss counted) in 2^32 packets of a path. */
static __always_inline __u32 peer_path_seq_take(struct mrc_peer_state *st, __u32 path_id)
{
	__u32 shift = (path_id & 1) * 32;

	barrier_var(path_id);
	return __sync_fetch_and_add(&st->path_seq[(path_id / 2) & (MRC_MAX_PATHS / 2 - 1)],
				    1ULL << shift) >> shift;
}

/* The send time from which on the peer has heard path_id */
static __always_inline __u64 *peer_path_acked(struct mrc_peer_state *st, __u32 path_id)
{
	return &peer_path_clock(st, path_id)->acked_ns;
}

/* The peer's acknowledgement window as it stands: ack_timeout, or the
 * wider one late packets taught (failover_ack_window also halves that
 * back when its hold is over; shared fate only reads it). */
static __always_inline __u64 peer_ack_window(const struct mrc_peer_acks *acks,
					     const struct mrc_config *cfg)
{
	__u64 base = (__u64)cfg->ack_timeout_us * 1000;

	return acks->window_ns > base ? acks->window_ns : base;
}

/* The 16-bit ce_stamp of `now` (path_health): never 0, which means never. */
static __always_inline __u16 peer_ce_stamp(__u64 now)
{
	__u16 stamp = now >> MRC_CE_STAMP_SHIFT;

	return stamp | !stamp;
}

/*
 * The path's own queue, as the peer last reported it, widens its window:
 * equally sprayed paths' queues drift apart by up to a buffer's depth
 * under load, and a live path must not go down for standing behind the
 * others.  Bounded by reorder_max_us (0: the window is ack_timeout).  The
 * price is a black hole seen about a queue late when every path queues
 * alike.
 *
 * Congestion is not failure (MRC: ECN or a trim skips a path, only
 * silence retires it): a path the peer reported congested (a CE mark or a
 * trim, path_health.ce_stamp) within the last 16 x reorder_max_us gets
 * reorder_max_us more.  Its packets are arriving (the report says so), a
 * full queue delays them by up to a buffer, and a packet lost at a full
 * queue is not news of the path until the next one is acknowledged, a
 * queue later; the smoothed queue it reported lags all of that.  The
 * news lapses by itself: a path that dies sends no more reports, so a
 * black hole on a path congested when it failed is seen at most about
 * one queue plus 2 x reorder_max_us late, and one on a path not
 * congested as before.  Branch-free (the reroute loop's verifier states).
 * Measurements, and the variants tried and taken out:
 * docs/design/failover.md.
 */
static __always_inline __u64 peer_path_queue_allowance(const struct mrc_config *cfg,
						       struct mrc_row_state *rs, __u32 path_id, __u64 now)
{
	struct mrc_path_health *h = row_path_health(rs, path_id);
	__s64 max = (__u64)cfg->reorder_max_us * 1000;
	__s64 queue = (__u64)h->qdelay_us * 1000, d;
	__u64 stamp = h->ce_stamp;
	/* ~1 ms units since the news, mod 2^16; fresh while <= max's */
	__s64 age = ((now >> MRC_CE_STAMP_SHIFT) - stamp) & 0xffff;
	/* fresh for 16 x reorder_max (the lone rule's, lib/failover.h): a
	 * path skipped after its news carries few packets, so little news,
	 * and its queue is still there when it is used again; at most half
	 * the stamp's wrap */
	__s64 fresh = (max * MRC_SILENCE_FACTOR) >> MRC_CE_STAMP_SHIFT;

	d = fresh - 0x7fff;		/* fresh = min(fresh, 0x7fff) */
	fresh -= d & ~(d >> 63);
	d = queue - max;		/* queue = min(queue, max) */
	queue -= d & ~(d >> 63);
	d = age - fresh - 1;
	/* + max while fresh (d < 0), and only if ever (stamp != 0) */
	return queue + (max & (d >> 63) & -(__s64)((stamp + 0xffff) >> 16));
}

#endif
