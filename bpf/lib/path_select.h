/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Choosing the path of one packet.  The cost is the same for 1 or 256
 * paths: the loader keeps, per peer and traffic class, a list of the path
 * ids that may be used (repeated by weight for the weighted policy), and a
 * packet takes one or two entries of it.  No walk over the set.
 */
#ifndef MRC_LIB_PATH_SELECT_H
#define MRC_LIB_PATH_SELECT_H

#include "lib/maps.h"
#include "lib/counters.h"
#include "lib/compiler.h"
#include "lib/failover.h"

struct path_choice {
	__u32	path_index;	/* key into paths/path_tx/path_stats */
	__u16	path_id;	/* index within the peer's set, sent in the TLV */
	__u8	tclass;
	__u8	probe;		/* the path is down and this packet tests it */
	__u8	control;	/* header only: feedback (mrc_fb's clone) or a probe copy */
	__u16	probe_copy;	/* 1 + id of a down path to test with a copy of this packet */
	struct mrc_path_live *live;
	__u64	peer_seq;
	__u64	path_seq;
	/* The send time, stamped in the TLV and kept as the path's last send:
	 * acknowledgements echo it, so the two must be the same number. */
	__u64	tx_ns;
};

/*
 * Lower is better: the queueing delay the peer last reported, plus a
 * penalty while a loss is recent.  A report older than the hold time is
 * forgotten (score 0): a path we stopped using gets no fresh reports, so
 * without this it could never win again; this way it is tried again.
 */
static __always_inline __u64 health_score(__u32 peer_id, __u16 path_id, __u64 now,
					  __u64 hold_ns)
{
	__u32 index = peer_id * MRC_MAX_PATHS + path_id;
	struct mrc_path_health *h = path_health.lookup(&index);

	if (!h || now - h->updated_ns > hold_ns)
		return 0;
	if (h->loss_ns && now - h->loss_ns < hold_ns)
		return (__u64)h->qdelay_us + 1000000;
	return h->qdelay_us;
}

/*
 * adaptive gives rr's turn to another path only when the turn's path
 * scores worse than twice the other's plus this much: under saturating
 * TCP the paths' reported queues differ by milliseconds from moment to
 * moment, and moving turns on that noise reorders the flows (random picks
 * let the queues drift apart; rr keeps them even).  A shaped or lossy
 * path is far beyond it (a full 20 ms queue; a loss adds 1 s).
 * Measured, one and four cubic flows over 4 x 100 Mbit/s: a quarter plus
 * 200 us gave 0.82 / 0.62 of capacity, this 0.83 / 0.75, rr 0.82 / 0.82.
 */
#define ADAPTIVE_MARGIN_US	1000

static __always_inline __u16 spray_pick(const struct mrc_spray *list, __u32 at)
{
	barrier_var(at);
	at &= MRC_SPRAY_SLOTS - 1;	/* at < n <= MRC_SPRAY_SLOTS, a power of two */
	return list->ids[at];
}

/* The path at list position `at`: its id, index and live state. */
static __always_inline struct mrc_path_live *live_at(const struct mrc_spray *list, __u32 at,
						     __u32 peer_id, __u16 *id, __u32 *index)
{
	*id = spray_pick(list, at);
	if (*id >= MRC_MAX_PATHS)
		return NULL;
	*index = peer_id * MRC_MAX_PATHS + *id;
	return path_live.lookup(index);
}

/*
 * From the policy's pick at list position `at`: the first path that is
 * up among it and MRC_REROUTE_TRIES more entries, the first of them at
 * random and then in order: a down path's turns spread over the others
 * (in order, under rr its successor would carry double).  An offset
 * rotating with the list's cycles (peer_seq / n) spreads them exactly, but
 * measured worse under TCP: the demo's transfer ran at 92-98 Mbit/s with
 * it against 102-104 at random, before the failure too.
 * A down path due a probe is not tested with a data packet (into a black
 * hole that would be a lost segment for TCP): with `may_copy`, the packet
 * goes on looking and a header-only copy of it tests the path
 * (choice->probe_copy).  If nothing is up the packet itself takes the
 * path due a probe, or else fails open: it goes on the pick, which is
 * being probed, rather than being dropped.
 */
static __always_inline int choose_live(const struct mrc_spray *list, __u32 n, __u32 at,
				       __u32 peer_id, struct mrc_peer_tx *ptx,
				       const struct mrc_config *cfg, __u64 now, int may_copy,
				       struct path_choice *choice)
{
	enum path_use use = PATH_SKIP;
	struct mrc_path_live *live = NULL;
	__u32 t, pos, copy_pos = 0, index = 0;
	__u16 id = 0, copy = 0;

	for (t = 0, pos = at; t <= MRC_REROUTE_TRIES; t++) {
		live = live_at(list, pos, peer_id, &id, &index);
		if (!live)
			return -1;
		use = path_check(live, cfg, peer_id, id, now);
		if (use == PATH_PROBE && may_copy && !copy) {
			count(MRC_TX_PROBE);
			live->probes++;
			copy = id + 1;
			copy_pos = pos;
			use = PATH_SKIP;
		}
		if (use != PATH_SKIP)
			break;
		pos = (pos + 1 + (t == 0 && n > 1 ? bpf_get_prandom_u32() % (n - 1) : 0)) % n;
	}
	if (use == PATH_SKIP && copy) {
		/* nothing else is up: the packet is the probe itself */
		live = live_at(list, copy_pos, peer_id, &id, &index);
		if (!live)
			return -1;
		copy = 0;
		use = PATH_USE;		/* counted as a probe above */
		choice->probe = 1;
	} else if (use == PATH_SKIP) {
		live = live_at(list, at, peer_id, &id, &index);
		if (!live)
			return -1;
		use = PATH_PROBE;
		count(MRC_TX_FAIL_OPEN);
		if (__sync_bool_compare_and_swap(&ptx->fail_open_ns, 0, now))
			event_log(peer_id, id, MRC_EV_FAIL_OPEN, now, 0);
	} else {
		if (t > 0)
			count(MRC_TX_REROUTE);
		/* over only when a path is up again, not at each probe */
		if (ptx->fail_open_ns && use == PATH_USE)
			ptx->fail_open_ns = 0;
	}
	if (use == PATH_PROBE) {
		count(MRC_TX_PROBE);
		live->probes++;
	}
	choice->path_id = id;
	choice->path_index = index;
	choice->probe |= use == PATH_PROBE;
	choice->probe_copy = copy;
	choice->live = live;
	return 0;
}

/*
 * Picks the packet's path from the spray list of its peer and class.
 * O(1) for every policy: one list lookup, then one or two entries of it.
 */
static __always_inline int choose_path(struct __sk_buff *skb, const struct mrc_peer *peer,
				       __u8 tclass, const struct mrc_config *cfg, int may_copy,
				       struct path_choice *choice)
{
	__u32 peer_id = peer->peer_id;
	__u32 list_index, n, a, b, at;
	__u64 now = bpf_ktime_get_ns();
	struct mrc_peer_tx *ptx;
	struct mrc_spray *list;

	if (peer_id >= MRC_MAX_PEERS || tclass >= MRC_MAX_CLASSES)
		return -1;
	list_index = peer_id * MRC_MAX_CLASSES + tclass;
	list = spray.lookup(&list_index);
	ptx = peer_tx.lookup(&peer_id);
	if (!list || !ptx)
		return -1;
	n = list->n;
	if (n == 0 || n > MRC_SPRAY_SLOTS)
		return -1;
	/* A per-peer number across all paths: the receiver reads
	 * reordering from it.  It is not used for loss, so a number taken
	 * by a packet that is dropped later does no harm. */
	choice->peer_seq = __sync_fetch_and_add(&ptx->seq, 1);
	choice->tclass = tclass;
	choice->probe = 0;

	switch (peer->policy) {
	case MRC_POLICY_RANDOM:
		at = bpf_get_prandom_u32() % n;
		break;
	case MRC_POLICY_HASH:
		at = bpf_get_hash_recalc(skb) % n;
		break;
	case MRC_POLICY_ADAPTIVE: {
		/* The power of two choices, one of them rr's turn: the turn's
		 * path keeps it unless a random other is clearly healthier.
		 * Alike paths are sprayed as by rr; a path reporting loss or a
		 * longer queue loses its turns until its reports age out. */
		__u64 hold = (__u64)cfg->loss_hold_us * 1000;
		__u64 score_a, score_b;

		a = choice->peer_seq % n;
		b = (a + 1 + bpf_get_prandom_u32() % (n > 1 ? n - 1 : 1)) % n;
		score_a = health_score(peer_id, spray_pick(list, a), now, hold);
		score_b = health_score(peer_id, spray_pick(list, b), now, hold);
		at = 2 * score_b + ADAPTIVE_MARGIN_US < score_a ? b : a;
		break;
	}
	case MRC_POLICY_BYTES: {
		/* rr over the peer's byte stream: the packet goes on the turn
		 * its first byte falls in, each turn `quantum` bytes.  rr
		 * balances packets, and TCP's segments are not all full (a
		 * write's tail, a push when the socket buffer fills): at a
		 * 3500-byte MTU rr's paths carried 69-88 MB for equal counts,
		 * the busiest path's queue grew and reordered the flow.  One
		 * atomic add, as for the sequence number. */
		__u64 off = __sync_fetch_and_add(&ptx->bytes, skb->len);

		at = list->quantum ? (off / list->quantum) % n : choice->peer_seq % n;
		break;
	}
	default:	/* MRC_POLICY_RR, MRC_POLICY_WEIGHTED (its list repeats by weight) */
		at = choice->peer_seq % n;
	}
	return choose_live(list, n, at, peer_id, ptx, cfg, now, may_copy, choice);
}

/*
 * A packet of `mrcctl probe`, marked MRC_PROBE_MARK | path id, or a probe
 * copy (MRC_PROBE_COPY_MARK | path id, counted as `counter`): it goes on
 * that path whatever its state or the policy, flagged a probe.  Its
 * acknowledgement is filed like any other, so a probed path that answers
 * comes back up and one that does not is taken down by the usual clock:
 * user space only supplies packets for paths that carry no traffic.
 */
static __always_inline int choose_pinned(const struct mrc_peer *peer, __u32 mark,
					 const struct mrc_config *cfg, __u32 counter,
					 struct path_choice *choice)
{
	__u32 peer_id = peer->peer_id;
	__u16 id = mark & ~MRC_PROBE_MARK_MASK;
	struct mrc_peer_tx *ptx;

	if (peer_id >= MRC_MAX_PEERS || id >= peer->n_paths)
		return -1;
	ptx = peer_tx.lookup(&peer_id);
	if (!ptx)
		return -1;
	choice->path_id = id;
	choice->path_index = peer_id * MRC_MAX_PATHS + id;
	choice->live = path_live.lookup(&choice->path_index);
	if (!choice->live)
		return -1;
	/* sent whatever the verdict, but the check applies what feedback
	 * said: an acknowledged probe brings the path up, an overdue one
	 * takes it down */
	path_check(choice->live, cfg, peer_id, id, bpf_ktime_get_ns());
	choice->peer_seq = __sync_fetch_and_add(&ptx->seq, 1);
	choice->tclass = 0;
	choice->probe = 1;
	choice->probe_copy = 0;
	count(counter);
	return 0;
}

#endif
