/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The receiver's measurements, from the MRC TLV of each valid packet:
 *   per (sender, path): packets, bytes, losses (a gap in path_seq: packets
 *   on one path arrive in order, so a gap is a loss, seen at once), late
 *   arrivals, and queueing delay (one-way delay above the path's minimum:
 *   the clock offset between two hosts cancels out);
 *   per sender: reordering across paths (peer_seq below the highest seen)
 *   with a histogram of its distance in packets.
 * XDP runs a receive queue on one CPU at a time, so these are plain
 * updates; a sender spread over several queues may race and lose a count.
 */
#ifndef MRC_LIB_RX_TRACK_H
#define MRC_LIB_RX_TRACK_H

#include "lib/maps.h"
#include "lib/compiler.h"
#include "lib/counters.h"
#include "lib/ports.h"

/* bucket 0: 0; bucket i: [2^(i-1), 2^i); the last bucket takes the rest.
 * A binary search (four tests) where a test a bit (15) cost RX ~10 ns. */
_Static_assert(MRC_HIST_BUCKETS == 16, "rx_track_log2_bucket searches 15 bits");
static __always_inline __u32 rx_track_log2_bucket(__u64 v)
{
	__u32 n = 0, step;

	if (v >= 1ULL << (MRC_HIST_BUCKETS - 2))
		return MRC_HIST_BUCKETS - 1;
#pragma unroll
	for (step = 8; step; step >>= 1) {
		if (v >> step) {
			n += step;
			v >>= step;
		}
	}
	return n + (__u32)v;
}

/*
 * The replay window of a path: p->seen after `seq` arrived, bit i for
 * path_seq next_seq - 2 - i.  Returns 0 if seq is new, -1 if it arrived
 * before or is behind the window.
 */
static __always_inline int rx_track_window(struct mrc_rx_path *p, __u32 seq)
{
	__s32 ahead = seq - p->next_seq;
	__u32 back;

	if (ahead >= 0) {
		/* the newest moves to seq; the old newest is bit `ahead` */
		p->seen = ahead >= MRC_AUTH_REPLAY_WINDOW - 1 ?
			  (ahead < MRC_AUTH_REPLAY_WINDOW ? 1ULL << (ahead & 63) : 0) :
			  (p->seen << ((ahead + 1) & 63)) | (1ULL << (ahead & 63));
		return 0;
	}
	back = p->next_seq - 2 - seq;	/* seq == next_seq - 1 (the newest): ~0 */
	if (back >= MRC_AUTH_REPLAY_WINDOW || (p->seen & (1ULL << (back & 63))))
		return -1;
	p->seen |= 1ULL << (back & 63);
	return 0;
}

/*
 * Returns whether the packet skipped sequence numbers (a new loss).  A
 * path last heard in another epoch of its sender starts again at this
 * packet.  `keyed`: a packet seen before (replayed) is not counted and
 * *stale is set.
 *
 * A burst (granularity, docs/design/spraying.md) leaves the sender as one
 * packet with one TLV; where it is cut into wire segments after TC (a
 * NIC's TSO, software GSO before a native-XDP peer) every segment carries
 * that same TLV.  So a TLV with the path's newest number again is such a
 * segment, not a late packet: counted on the path, *segment set, and not
 * filed again.  A replay of the newest TLV passes as one, and is harmless
 * so: it is counted and never filed (it says nothing the first did not).
 */
static __always_inline int rx_track_path(const __u8 *src_sid, const struct mrc_tlv *tlv,
					 __u32 bytes, __u64 now, int keyed, int ce, int *stale,
					 int *segment, __u64 *before, __u32 *made)
{
	struct mrc_rx_key key = {};
	struct mrc_rx_path *p;
	__u32 seq = bpf_ntohl(tlv->path_seq), epoch = bpf_ntohl(tlv->epoch);
	__s64 owd = (__s64)(now - mrc_ntohll(tlv->tx_ns));
	__u64 qdelay_us;
	int gap = 0, first = 0;

	__builtin_memcpy(key.sid, src_sid, 16);
	key.path_id = bpf_ntohs(tlv->path_id);
	p = mrc_rx_paths.lookup(&key);
	if (!p) {
		struct mrc_rx_path fresh = { .next_seq = seq, .min_owd_ns = owd, .epoch = epoch };

		mrc_rx_paths.update(&key, &fresh);
		p = mrc_rx_paths.lookup(&key);
		if (!p)
			return 0;
		*made |= 2;
		first = 1;
	}
	if (p->epoch != epoch) {
		/* the sender re-attached: its numbers begin again */
		p->epoch = epoch;
		p->next_seq = seq;
		p->min_owd_ns = owd;
		p->seen = 0;
		first = 1;
	}
	if (!first && seq == p->next_seq - 1) {
		p->packets++;
		p->bytes += bytes;
		if (ce)
			p->ce++;
		*segment = 1;
		return 0;
	}
	/* the first packet of an epoch opens an empty window */
	if (!first && rx_track_window(p, seq) && keyed) {
		*stale = 1;
		return 0;
	}
	p->packets++;
	p->bytes += bytes;
	p->last_ns = now;
	if (ce)
		p->ce++;
	/* the newest send, not the latest arrival: a packet overtaken on
	 * its path (two CPUs) must not make the acknowledgement go back */
	*before = p->latest_tx;
	if (*before < mrc_ntohll(tlv->tx_ns))
		p->latest_tx = mrc_ntohll(tlv->tx_ns);
	if ((__s32)(seq - p->next_seq) >= 0) {
		gap = seq != p->next_seq;
		p->lost += seq - p->next_seq;	/* 0 when in order */
		p->next_seq = seq + 1;
	} else {
		p->late++;
	}
	if (owd < (__s64)p->min_owd_ns)
		p->min_owd_ns = owd;
	qdelay_us = (__u64)(owd - (__s64)p->min_owd_ns) / 1000;	/* >= 0 */
	p->qdelay_us = (p->qdelay_us * 7 + qdelay_us) / 8;
	p->qdelay_hist[rx_track_log2_bucket(qdelay_us) & (MRC_HIST_BUCKETS - 1)]++;
	p->qdelay_sum_us += qdelay_us;
	return gap;
}

/*
 * The sender's entry, made on its first packet.  A new epoch (it
 * re-attached) restarts its reordering baseline; with a key (`keyed`,
 * the TLV authenticated) only a later epoch does, and a TLV of an older
 * one is not filed: NULL and *why set.  Without a key any other epoch
 * is taken as the new one, as whoever sends it could forge anything else.
 */
static __always_inline struct mrc_rx_peer *rx_track_sender(const __u8 *src_sid,
							   const struct mrc_tlv *tlv,
							   int keyed, __u32 *why, __u32 *made)
{
	struct mrc_sid sid;
	struct mrc_rx_peer *peer;
	__u32 epoch = bpf_ntohl(tlv->epoch);

	__builtin_memcpy(sid.addr, src_sid, 16);
	peer = mrc_rx_peers.lookup(&sid);
	if (!peer) {
		/* too big for the stack: start from the never-written zero entry */
		__u32 zero = 0;
		struct mrc_rx_peer *fresh = mrc_rx_peer_zero.lookup(&zero);

		if (!fresh)
			return NULL;
		mrc_rx_peers.update(&sid, fresh);
		peer = mrc_rx_peers.lookup(&sid);
		if (!peer) {
			*made |= 4;
			return NULL;
		}
		*made |= 1;
		peer->max_peer_seq = bpf_ntohl(tlv->peer_seq);
		peer->epoch = epoch;
	}
	if (peer->epoch != epoch) {
		if (keyed && (__s32)(epoch - peer->epoch) < 0) {
			*why = MRC_RX_AUTH_OLD_EPOCH;
			return NULL;
		}
		peer->epoch = epoch;
		peer->max_peer_seq = bpf_ntohl(tlv->peer_seq);
		peer->restarts++;
		count(MRC_RX_EPOCH);
	}
	return peer;
}

/*
 * A packet sent at `sent` arrived on `path_id`, whose newest send before
 * it was `before`: the path joins its block's next report (`heard`), whose
 * one lower bound for all its paths is the oldest of their sends
 * (heard_since).  The bound acknowledges a path only if it is above the
 * path's send before those (the sender's clock runs from its oldest
 * unacknowledged send), so a path joins only if the bound stays above
 * every member's earlier send (heard_need) and above its own; else it is
 * reported exactly (heard_slow).  Kept here, per packet, so that a
 * report costs the sender of the feedback O(1) however many paths there
 * are, and every path heard is acknowledged by the next report.  Two
 * CPUs may race here and in feedback_fill_heard: the bound is written
 * before the bit, so a report that sees the bit has a bound at or below
 * its send.
 */
static __always_inline void rx_track_heard(struct mrc_rx_peer *peer, __u16 path_id, __u64 sent,
					   __u64 before)
{
	__u32 block = (path_id / 64) & (MRC_MAX_PATHS / 64 - 1);
	__u64 bit = 1ULL << (path_id & 63);
	__u64 members = peer->heard[block];

	if (members & bit || sent <= before)
		return;		/* a member (a newer send only raises its own bound),
				 * or a packet overtaken on its path: nothing new */
	if (!members) {
		peer->heard_since[block] = sent;
		peer->heard_need[block] = before;
	} else if (sent > peer->heard_need[block] && before < peer->heard_since[block]) {
		if (sent < peer->heard_since[block])
			peer->heard_since[block] = sent;
		if (before > peer->heard_need[block])
			peer->heard_need[block] = before;
	} else {
		peer->heard_slow[block] |= bit;
		return;
	}
	peer->heard_slow[block] &= ~bit;
	__sync_fetch_and_or(&peer->heard[block], bit);
}

/* A CE mark on our path PATH_ID from this sender: told in the next
 * report that names the path (lib/feedback.h) */
static __always_inline void rx_track_ce_news(struct mrc_rx_peer *peer, __u16 path_id)
{
	peer->ce_news[(path_id / 64) & (MRC_MAX_PATHS / 64 - 1)] |= 1ULL << (path_id & 63);
}

/* BEFORE: the path's newest send before this packet (rx_paths), 0 when
 * the pair is new to us (or was evicted): as its first packet */
static __always_inline void rx_track_peer(struct mrc_rx_peer *peer, const struct mrc_tlv *tlv, int gap,
					  int ce, __u64 before)
{
	__u32 peer_seq = bpf_ntohl(tlv->peer_seq);

	peer->packets++;
	peer->last_path_id = bpf_ntohs(tlv->path_id);
	if (gap)
		peer->loss_news[(peer->last_path_id / 64) & (MRC_MAX_PATHS / 64 - 1)] |=
			1ULL << (peer->last_path_id & 63);
	if (ce)
		rx_track_ce_news(peer, peer->last_path_id);
	rx_track_heard(peer, peer->last_path_id, mrc_ntohll(tlv->tx_ns), before);
	if ((__s32)(peer_seq - peer->max_peer_seq) > 0) {
		peer->max_peer_seq = peer_seq;
	} else if (peer_seq != peer->max_peer_seq) {
		__u32 behind = peer->max_peer_seq - peer_seq;

		peer->reordered++;
		peer->reorder_hist[rx_track_log2_bucket(behind) & (MRC_HIST_BUCKETS - 1)]++;
		peer->reorder_sum += behind;
	}
}

/*
 * What a valid packet's TLV tells the receiver, filed; `ce`: its outer
 * header arrived CE-marked (a fabric queue on its path is filling).
 * Returns 0 when its feedback may be filed too, or the counter saying
 * why not.
 */
static __always_inline __u32 rx_track(const __u8 *src_sid, const struct mrc_tlv *tlv, __u32 bytes,
				      __u64 now, int keyed, int ce, struct mrc_rx_peer **sender)
{
	struct mrc_rx_peer *peer;
	__u32 why = 0;
	__u64 before = 0;
	__u32 made = 0;
	int gap, stale = 0, segment = 0;

	peer = rx_track_sender(src_sid, tlv, keyed, &why, &made);
	*sender = peer;
	if (why)
		return why;
	gap = rx_track_path(src_sid, tlv, bytes, now, keyed, ce, &stale, &segment, &before, &made);
	/* counted here, on every packet, not where the entries are made: a
	 * count there (or a branch on `made` here) cost mrc_rx 150-250k more
	 * verifier instructions (the states after it no longer prune) */
	count_add(MRC_RX_SENDER_NEW, made & 1);
	count_add(MRC_RX_PATH_NEW, (made >> 1) & 1);
	count_add(MRC_RX_SENDER_FAIL, made >> 2);
	if (stale)
		return MRC_RX_AUTH_REPLAY;
	if (segment) {
		/* its burst's first segment was filed; a CE mark is news */
		if (ce && peer)
			rx_track_ce_news(peer, bpf_ntohs(tlv->path_id));
		return MRC_RX_SEGMENT;
	}
	if (peer) {
		rx_track_peer(peer, tlv, gap, ce, before);
		ports_file(peer, src_sid, tlv, now);	/* port status: lib/ports.h */
	}
	return 0;
}

#endif
