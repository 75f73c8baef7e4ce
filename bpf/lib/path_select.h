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
#include "lib/event_log.h"
#include "lib/failover.h"
#include "lib/peer_state.h"
#include "lib/roce.h"

struct path_choice {
	__u32	path_index;	/* key into paths */
	__u16	path_id;	/* index within the peer's set, sent in the TLV */
	__u8	tclass;
	__u8	probe;		/* the path is down and this packet tests it */
	__u8	control;	/* header only: feedback (mrc_fb's clone) or a probe copy */
	__u8	keep_news;	/* tests a path while others may be up: its report consumes nothing (lib/feedback.h) */
	__u16	probe_copy;	/* 1 + id of a down path to test with a copy of this packet */
	__u16	pos;		/* the path's position in the spray list (roce policy: the QP's) */
	struct mrc_peer_state *st;	/* the peer's learnt state */
	struct mrc_row_state *rs;	/* its row's: the paths' */
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
static __always_inline __u64 path_select_health_score(struct mrc_row_state *rs, __u16 path_id,
					  __u64 now, __u64 hold_ns)
{
	struct mrc_path_health *h = row_path_health(rs, path_id);

	if (now - h->updated_ns > hold_ns)
		return 0;
	if (h->loss_ns && now - h->loss_ns < hold_ns)
		return (__u64)h->qdelay_us + 1000000;
	return h->qdelay_us;
}

/*
 * adaptive gives rr's turn to another path only when the turn's path
 * scores worse than twice the other's plus this much: under saturating
 * TCP the paths' reported queues differ by milliseconds from moment to
 * moment, and moving turns on that noise reorders the flows.  A shaped or
 * lossy path is far beyond it (a full 20 ms queue; a loss adds 1 s).
 * How it was chosen: docs/design/spraying.md.
 */
#define ADAPTIVE_MARGIN_US	1000

static __always_inline __u16 path_select_pick(const struct mrc_spray *list, __u32 at)
{
	barrier_var(at);
	at &= MRC_SPRAY_SLOTS - 1;	/* at < n <= MRC_SPRAY_SLOTS, a power of two */
	return list->ids[at];
}

/* Path `id` of row `row`: its index and live state. */
static __always_inline struct mrc_path_live *path_select_live_id(__u32 row, struct mrc_row_state *rs,
						     __u16 id, __u32 *index)
{
	if (id >= MRC_MAX_PATHS)
		return NULL;
	*index = row * MRC_MAX_PATHS + id;
	return row_path_live(rs, id);
}

/* Is there news of path `id` past its down (what failover_path_check
 * brings it back on): the peer's acknowledgement, or the row's exact
 * one, of a send at or after down_after_ns. */
static __always_inline int path_select_news(struct mrc_peer_state *st, struct mrc_row_state *rs, __u32 id,
					    const struct mrc_path_live *live)
{
	return *peer_path_acked(st, id) >= live->down_after_ns || row_path(rs, id)->heard_ns >= live->down_after_ns;
}

/*
 * Spare EVs (issue 29): the path that takes the turn of the pick `id`:
 * the pick itself unless it is out (down_ns: assumed bad; one the check
 * takes out now gets its spare from the next packet on) and has a spare
 * that is not: its spare (struct mrc_spares: the loader's, of the same
 * plane), unless that is out too.  One spare a path: a second, tried
 * when the first is out, took mrc_tx past 960k processed instructions.
 * A spare is in no spray list, so it carries only the turns of a path
 * that is out, and is held back again once that path is back.  The pick
 * is left to the reroute loop's check when the check would change it:
 * news of it (it comes back) or a probe due (the copy of that packet
 * tests it, and the packet takes the next turn, as before spares; one
 * turn a probe interval).  A spare out itself is left to the check too
 * when it is due a probe or has news (else nothing would ever bring it
 * back: it is in no list); meanwhile the pick's turn is skipped, as
 * without spares.  Here, before the loop, so that the loop is as before
 * (every way out gives an id of the same range; a probe copy made here,
 * or a spare tried inside the loop, took mrc_tx past 1M or its stack
 * past 512 bytes); the key is the caller's (the stack is full).  O(1):
 * one word read for a pick that is up, one lookup for one that is out.
 */
static __always_inline __u32 path_select_spare(__u32 *row_key, struct mrc_peer_state *st,
					       struct mrc_row_state *rs, __u32 id, __u64 now)
{
	struct mrc_path_live *live;
	struct mrc_spares *s;
	__u32 c;

	id &= MRC_MAX_PATHS - 1;
	live = row_path_live(rs, id);
	if (!live->down_ns || now >= live->next_probe_ns || path_select_news(st, rs, id, live))
		return id;
	s = mrc_spares.lookup(row_key);
	if (!s)
		return id;
	c = (s->of[id] - 1) & (MRC_MAX_PATHS - 1);
	if (!s->of[id])
		return id;
	live = row_path_live(rs, c);
	if (live->down_ns && now < live->next_probe_ns && !path_select_news(st, rs, c, live))
		return id;
	return c;
}

/* The policies whose pick is a turn handed out by a counter, which a
 * packet whose turn's path is down can skip. */
static __always_inline int path_select_takes_turns(__u8 policy)
{
	return policy == MRC_POLICY_RR || policy == MRC_POLICY_WEIGHTED ||
	       policy == MRC_POLICY_BYTES;
}

/* Turns of bytes rather than packets (adaptive's turn is bytes' turn). */
static __always_inline int path_select_turns_of_bytes(__u8 policy, const struct mrc_spray *list)
{
	return (policy == MRC_POLICY_BYTES || policy == MRC_POLICY_ADAPTIVE) && list->quantum;
}

/*
 * Byte turns: the turn the packet starts in, each turn as long as the
 * largest of the peer's recent packets: a segment per packet, a burst at
 * burst granularity, whatever the device's gso_max_segs is now.  So packets of that
 * size go one a turn, as under rr, and smaller ones share a turn: paths
 * carry equal bytes.  A fixed turn of the largest possible burst (64 KB)
 * evened every 10 ms window at line rate but not a paced flow's small
 * bursts (several a turn, a few turns a window); a turn of one segment
 * scattered 64 KB bursts over the paths by their sizes
 * (docs/performance/line-rate.md).  The maximum decays by 1/64 a packet,
 * so it follows the flow down; small packets (ACKs) do not pull it.
 */
static __always_inline __u32 path_select_byte_turn(const struct mrc_spray *list, __u32 n,
				       struct mrc_peer_tx *ptx, __u32 len)
{
	__u32 turn = ptx->turn_len, cap = list->quantum;
	__u64 off;

	turn -= turn / 64;
	if (turn < len)
		turn = len;
	if (turn > cap)
		turn = cap;
	if (!turn)
		turn = 1;
	ptx->turn_len = turn;
	off = __sync_fetch_and_add(&ptx->turns_q16, ((__u64)len << 16) / turn);
	return (off >> 16) % n;
}

/*
 * Skips the turn at list position `at`, whose path is down: the packet
 * takes the next turn, and the counter moves on by one turn so that no
 * later packet is given that one too; the stream goes on as if the down
 * path were not in the list.  For bytes the packet keeps its place within
 * the turn (a full-size packet mostly straddles two: placing it by the
 * counter's new value put it two turns on, and the path after the down
 * one got nothing).
 */
static __always_inline __u32 path_select_skip_turn(const struct mrc_spray *list, __u32 n,
				       struct mrc_peer_tx *ptx, __u8 policy, __u32 at)
{
	if (path_select_turns_of_bytes(policy, list))
		__sync_fetch_and_add(&ptx->turns_q16, 1ULL << 16);
	else
		__sync_fetch_and_add(&ptx->seq, 1);
	return (at + 1) % n;
}

/*
 * From the policy's pick at list position `at`: the first path that is
 * up among it and MRC_REROUTE_TRIES more entries (the first try: the
 * pick's spare if the pick is out, path_select_spare).  Under the turn-taking
 * policies (rr, weighted, bytes) the first of them is the next turn
 * (path_select_skip_turn): a down path's turn is skipped, as if it were not in the
 * list, and the others carry exactly equal shares.
 * The next entry without taking the turn would give the successor double;
 * a random one lets the remaining paths' queues drift apart
 * (docs/design/spraying.md).  If that turn's path is down too (a run of down paths
 * in the list), the next try is at random, then in order, as for the
 * other policies from the first try.  A list of at most
 * MRC_REROUTE_TRIES + 1 entries is tried in order from the pick: every
 * entry once, so a packet never fails open while one path is up (at
 * random, with 3 of 4 out it missed the live one 16% of the time).
 * A down path due a probe is not tested with a data packet (into a black
 * hole that would be a lost segment for TCP): with `may_copy`, the packet
 * goes on looking and a header-only copy of it tests the path
 * (choice->probe_copy).  If nothing is up the packet itself takes the
 * path due a probe, or else fails open: it goes on a path that is
 * being probed, rather than being dropped: the tried path the peer heard
 * from last (the pick if none was ever heard).  One probe copy a packet:
 * a second down path due a probe among its tries waits for the next.
 */
static __always_inline int path_select_live(const struct mrc_spray *list, __u32 n, __u32 at,
				       const struct mrc_peer *peer, struct mrc_peer_state *st,
				       struct mrc_row_state *rs, __u8 policy,
				       const struct mrc_config *cfg, __u64 now, int may_copy, __u32 first,
				       struct path_choice *choice)
{
	int turns = path_select_takes_turns(policy);
	__u32 peer_id = peer->peer_id, row = peer->template_id;
	struct mrc_peer_tx *ptx = &st->tx;
	enum path_use use = PATH_SKIP;
	struct mrc_path_live *live = NULL;
	__u32 t, pos, copy_pos = 0, open_pos = at, index = 0;
	/* the pick, or the spare that takes its turn (path_select_spare) */
	__u16 id = first, copy = 0;
	__u64 acked, open_acked = 0;

	for (t = 0, pos = at; t <= MRC_REROUTE_TRIES; t++) {
		live = path_select_live_id(row, rs, id, &index);
		if (!live)
			return -1;
		/* shared fate's hook: the policy's pick only (verifier budget) */
		use = failover_path_check(live, cfg, st, rs, peer, id, now, t == 0);
		if (use == PATH_PROBE && may_copy) {
			if (!copy) {
				count(MRC_TX_PROBE);
				live->probes++;
				copy = id + 1;
				copy_pos = pos;
			} else {
				/* one copy a packet: a second path due a probe
				 * waits for the next packet, not this one's data
				 * (into a black hole: lost) */
				live->next_probe_ns = now;
				live->probe_gap_us >>= 1;	/* not probed: no backoff */
			}
			use = PATH_SKIP;
		}
		if (use != PATH_SKIP)
			break;
		/* failing open, the path heard from last is the likeliest
		 * to be alive (a live one taken out falsely, or skipped as
		 * its hop is suspect, rather than one that went silent) */
		acked = *peer_path_acked(st, id);
		if (t == 0 || acked > open_acked) {
			open_acked = acked;
			open_pos = pos;
		}
		if (t == 0 && turns)
			pos = path_select_skip_turn(list, n, ptx, policy, pos);
		else if (t == (__u32)turns && n > MRC_REROUTE_TRIES + 1)
			pos = (pos + 1 + bpf_get_prandom_u32() % (n - 1)) % n;
		else
			pos = (pos + 1) % n;
		id = path_select_pick(list, pos);
	}
	/* a probe while a path may be up (a control packet that found its
	 * path due) leaves its report's news for the next packet; a packet
	 * with nowhere else to go (below) is the news's only carrier */
	choice->keep_news = use == PATH_PROBE;
	if (use == PATH_SKIP && copy) {
		/* nothing else is up: the packet is the probe itself */
		id = copy - 1;
		live = path_select_live_id(row, rs, id, &index);
		if (!live)
			return -1;
		pos = copy_pos;
		copy = 0;
		use = PATH_USE;		/* counted as a probe above */
		choice->probe = 1;
	} else if (use == PATH_SKIP) {
		id = path_select_pick(list, open_pos);
		live = path_select_live_id(row, rs, id, &index);
		if (!live)
			return -1;
		pos = open_pos;
		use = PATH_PROBE;
		count(MRC_TX_FAIL_OPEN);
		if (__sync_bool_compare_and_swap(&ptx->fail_open_ns, 0, now))
			failover_event_log(peer_id, id, MRC_EV_FAIL_OPEN, now, 0);
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
	/* the probe budget (lib/failover.h): a copy it holds back is not sent */
	if (copy && !failover_probe_budget(cfg, rs, row * MRC_MAX_PATHS + copy - 1, copy - 1, now))
		copy = 0;
	choice->path_id = id;
	choice->path_index = index;
	choice->pos = pos;
	choice->probe |= use == PATH_PROBE;
	choice->probe_copy = copy;
	choice->st = st;
	choice->rs = rs;
	choice->live = live;
	return 0;
}

/*
 * Picks the packet's path from the spray list of its peer and class.
 * O(1) for every policy: one list lookup, then one or two entries of it.
 */
static __always_inline int path_select(struct __sk_buff *skb, const struct mrc_peer *peer,
				       __u8 tclass, const struct mrc_config *cfg, int may_copy,
				       const struct mrc_roce_pkt *roce, struct path_choice *choice)
{
	__u32 row = peer->template_id;
	__u32 list_index, n, a, b, at;
	__u64 now = bpf_ktime_get_ns();
	struct mrc_peer_state *st;
	struct mrc_row_state *rs;
	struct mrc_peer_tx *ptx;
	struct mrc_spray *list;

	if (row >= MRC_MAX_PEERS || tclass >= MRC_MAX_CLASSES)
		return -1;
	list_index = row * MRC_MAX_CLASSES + tclass;
	list = mrc_spray.lookup(&list_index);
	rs = row_state_get(row);
	if (!list || !rs)
		return -1;
	st = peer_state_get(peer->peer_id);
	if (!st) {
		count(MRC_STATE_FAIL);
		return -1;
	}
	ptx = &st->tx;
	n = list->n;
	if (n == 0 || n > MRC_SPRAY_SLOTS)
		return -1;
	/* A per-peer number across all paths: the receiver reads
	 * reordering from it.  It is not used for loss, so a number taken
	 * by a packet that is dropped later does no harm. */
	choice->peer_seq = __sync_fetch_and_add(&ptx->seq, 1);
	/* new state: its turns start at its own offset (lib/peer_state.h) */
	choice->peer_seq = peer_state_turn(st, choice->peer_seq, peer->peer_id, n, row);
	choice->tclass = tclass;
	choice->probe = 0;
	/* the send time too: one clock read a packet (each costs 20-40 ns,
	 * a tenth of TX in BPF_PROG_TEST_RUN) */
	choice->tx_ns = now;

	switch (peer->policy) {
	case MRC_POLICY_RANDOM:
		at = bpf_get_prandom_u32() % n;
		break;
	case MRC_POLICY_HASH:
		at = bpf_get_hash_recalc(skb) % n;
		break;
	case MRC_POLICY_ADAPTIVE: {
		/* The power of two choices, one of them bytes' turn: the turn's
		 * path keeps it unless a random other is clearly healthier.
		 * Alike paths are sprayed as by bytes; a path reporting loss or a
		 * longer queue loses its turns until its reports age out. */
		__u64 hold = (__u64)cfg->loss_hold_us * 1000;
		__u64 score_a, score_b;

		a = path_select_turns_of_bytes(peer->policy, list) ? path_select_byte_turn(list, n, ptx, skb->len)
						       : choice->peer_seq % n;
		b = (a + 1 + bpf_get_prandom_u32() % (n > 1 ? n - 1 : 1)) % n;
		score_a = path_select_health_score(rs, path_select_pick(list, a), now, hold);
		score_b = path_select_health_score(rs, path_select_pick(list, b), now, hold);
		at = 2 * score_b + ADAPTIVE_MARGIN_US < score_a ? b : a;
		break;
	}
	case MRC_POLICY_BYTES: {
		/* rr over the peer's byte stream: the packet goes on the turn
		 * it starts in, each turn the peer's recent largest packet
		 * (path_select_byte_turn).  rr
		 * balances packets, and TCP's segments are not all full (a
		 * write's tail, a push when the socket buffer fills): at a
		 * 3500-byte MTU rr's paths carried 69-88 MB for equal counts,
		 * the busiest path's queue grew and reordered the flow.  One
		 * atomic add, as for the sequence number. */
		at = path_select_turns_of_bytes(peer->policy, list) ? path_select_byte_turn(list, n, ptx, skb->len)
							: choice->peer_seq % n;
		break;
	}
	default:
		/* MRC_POLICY_RR, MRC_POLICY_WEIGHTED (its list repeats by
		 * weight): seq_mul 1, pos 0; MRC_POLICY_ROCE: a QP's packet
		 * its position, seq_mul 0 (lib/roce.h), another packet rr */
		at = (choice->peer_seq * roce->seq_mul + roce->pos) % n;
	}
	/* the pick's path skipped for congestion (a CE report): its turn
	 * is skipped, as a down path's is (lib/failover.h, failover_skip),
	 * and so is the next one's if it is skipped too.  Here, before the
	 * reroute loop and at most twice a packet: the verifier's budget is
	 * the loop's (a third skipped path in a row is used).  Not only
	 * while skip_rotations is set: a skip running when it is set to 0
	 * runs out (and gives its floor place back). */
	if (failover_skip(cfg, rs, peer, path_select_pick(list, at), now)) {
		at = path_select_skip_turn(list, n, ptx, peer->policy, at);
		if (failover_skip(cfg, rs, peer, path_select_pick(list, at), now))
			at = path_select_skip_turn(list, n, ptx, peer->policy, at);
	}
	/* the pick, or its spare if it is out (the key: the list's, no
	 * longer needed) */
	if (path_select_pick(list, at) >= MRC_MAX_PATHS)
		return -1;
	/* an unheard send on the pick that may be no silence (a lone one on a
	 * congested path, one from before a pause) is tested, not judged
	 * (failover_pause, failover_lone) */
	failover_pause(cfg, st, now);
	failover_lone(cfg, st, rs, path_select_pick(list, at), now);
	list_index = row;
	return path_select_live(list, n, at, peer, st, rs, peer->policy, cfg, now, may_copy,
				path_select_spare(&list_index, st, rs, path_select_pick(list, at), now), choice);
}

/*
 * A packet of `mrcctl probe`, marked MRC_PROBE_MARK | path id, or a probe
 * copy (MRC_PROBE_COPY_MARK | path id, counted as `counter`): it goes on
 * that path whatever its state or the policy, flagged a probe.  Its
 * acknowledgement is filed like any other, so a probed path that answers
 * comes back up and one that does not is taken down by the usual clock:
 * user space only supplies packets for paths that carry no traffic.
 */
static __always_inline int path_select_pinned(const struct mrc_peer *peer, __u32 mark,
					 const struct mrc_config *cfg, __u32 counter,
					 struct path_choice *choice)
{
	__u32 row = peer->template_id;
	__u16 id = mark & ~MRC_PROBE_MARK_MASK;
	struct mrc_peer_state *st;
	struct mrc_row_state *rs;

	if (row >= MRC_MAX_PEERS || id >= peer->n_paths || id >= MRC_MAX_PATHS)
		return -1;
	st = peer_state_get(peer->peer_id);
	rs = row_state_get(row);
	if (!st || !rs)
		return -1;
	choice->path_id = id;
	choice->path_index = row * MRC_MAX_PATHS + id;
	choice->st = st;
	choice->rs = rs;
	choice->live = row_path_live(rs, id);
	/* sent whatever the verdict, but the check applies what feedback
	 * said: an acknowledged probe brings the path up, an overdue one
	 * takes it down */
	choice->tx_ns = bpf_ktime_get_ns();
	failover_path_check(choice->live, cfg, st, rs, peer, id, choice->tx_ns, 0);
	/* It takes no turn: it shares the number the next packet gets.
	 * Taking one moved rr's turns on by one at each probe, and the path
	 * after the probed one lost a turn per probe interval (3%). */
	choice->peer_seq = st->tx.seq;
	choice->tclass = 0;
	choice->probe = 1;
	choice->keep_news = 1;
	choice->probe_copy = 0;
	count(counter);
	return 0;
}

#endif
