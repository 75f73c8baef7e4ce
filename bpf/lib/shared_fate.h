/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Shared fate: two paths taken out through one first hop make it
 * suspect, as does its watched send (the oldest unheard one through it,
 * of any peer) found overdue by any packet through it; then every other path of every peer through that hop is tested
 * at once instead of each losing its own data first.  A suspect path the peer has not
 * acknowledged since the suspicion began is skipped, and its next turn
 * sends a header-only probe copy (as for a down path); it is taken out
 * when the peer acknowledges sends a window after the probe on other
 * paths but not the probe (the failover rule, applied to the probe), and
 * used again as soon as the probe, or any later send, is acknowledged.
 * O(1) per packet: two array lookups, and one peer_state lookup for the
 * watch's verdict and one after a send through a hop.  Design: docs/design/shared-fate.md.
 */
#ifndef MRC_LIB_SHARED_FATE_H
#define MRC_LIB_SHARED_FATE_H

#include "lib/maps.h"
#include "lib/compiler.h"
#include "lib/peer_state.h"


/*
 * A watch's `who`: the watched send's peer and path, and the queue
 * allowance its path had then (us, 16 bits): the watch is judged by the
 * window failover judges that path by, without a lookup of its row's
 * state at each judging (that lookup cost mrc_tx a third of the
 * verifier's budget).
 */
#define FATE_WHO_PEER(who)	((__u32)((who) >> 16))
#define FATE_WHO_ALLOW_NS(who)	(((who) >> 48) * 1000)

/* shared_fate_check(): this packet's turn tests the path with a probe copy */
#define FATE_PROBE_NOW	1
/* mrc_hop.watch_ns while one CPU rewrites the watch (a send time is never 1) */
#define FATE_WATCH_BUSY	1


static __always_inline struct mrc_hop *shared_fate_hop(struct mrc_path_fate *pf)
{
	__u32 hop;

	if (!pf || !pf->hop)
		return NULL;
	hop = pf->hop;
	barrier_var(hop);
	hop &= MRC_MAX_HOPS - 1;
	return mrc_hops.lookup(&hop);
}

/* `index`: the path's place in its row (path_fate), which names its hop;
 * `who`: peer_id << 16 | path_id.  The path was just taken out
 * (`shared`: by its probe, as counted on the hop), or is out and due
 * another probe (its last one went unanswered).
 * A hop not suspect becomes suspect only when a second path through it
 * goes down within a hold of the last lone one, and the suspicion starts
 * at that first down (a path heard since is clear): one down alone is
 * most often false (a live path's acknowledgement trailed, thousands of
 * them on a loaded machine), and made every idle path of the hop skipped
 * for a round trip; a black hole takes the second path out a turn later.
 * A suspicion already running is extended by a hold from now and keeps
 * its start: a hop that fails only in part does not have its live paths
 * probed again at every probe of its dead ones. */
static __always_inline void shared_fate_path_down(const struct mrc_config *cfg, __u32 index, __u64 who,
						  int shared, __u64 now)
{
	__u64 hold = (__u64)cfg->probe_us * 1000 * MRC_FATE_HOLD_FACTOR;
	struct mrc_path_fate *pf;
	struct mrc_hop *h;
	__u64 until, lone;

	if (!cfg->shared_fate)
		return;
	pf = mrc_path_fate.lookup(&index);
	h = shared_fate_hop(pf);
	if (!h)
		return;
	if (shared)
		__sync_fetch_and_add(&h->shared_downs, 1);
	until = h->until_ns;
	if (now < until) {
		if (now + hold > until)
			h->until_ns = now + hold;
		return;
	}
	lone = h->lone_ns;
	if (!lone || now >= lone + hold || h->lone_who == who) {
		/* the first (or the same path still out): remembered */
		h->lone_ns = now;
		h->lone_who = who;
		return;
	}
	if (__sync_bool_compare_and_swap(&h->until_ns, until, now + hold)) {
		h->suspect_ns = lone;
		h->lone_ns = 0;
		__sync_fetch_and_add(&h->suspects, 1);
	}
}

/*
 * The hop's watch (struct mrc_hop): is its watched send overdue by the
 * failover rule, its peer having acknowledged sends a window later (on
 * other paths) but not it?  Then the hop is suspect at once, from that
 * send on.  Under uniform load a host sends on each path only every ~15
 * ms, and a path is taken out only at its own next turn: by then every
 * peer had lost its packet into a dead spine; the watch is judged by
 * every packet through the hop, of any peer, so a hole is seen about one
 * send-to-the-watched-peer plus a report after the first loss.  One
 * overdue send suspects its hop, unlike a down (two, shared_fate_path_down):
 * a suspicion costs idle paths a probe copy and a skipped turn, no data.
 * Comparing within one peer only: peers report at different times, and
 * one peer's ack of a later send says nothing of another's earlier one.
 * One lookup of the watched peer's state.
 */
static __always_inline void shared_fate_watch_one(const struct mrc_config *cfg, struct mrc_hop *h,
						  __u64 *wns, __u64 *wwho, __u64 *wafter, __u64 now)
{
	__u64 hold = (__u64)cfg->probe_us * 1000 * MRC_FATE_HOLD_FACTOR;
	__u64 w = *wns, who, after, window;
	struct mrc_peer_state *ws;
	__u32 peer_id, path_id;

	if (w <= FATE_WATCH_BUSY)
		return;
	who = *wwho;
	after = *wafter;
	barrier_var(who);
	if (*wns != w)	/* rewritten meanwhile: who may be the new one's */
		return;
	peer_id = FATE_WHO_PEER(who);
	path_id = who & 0xffff;
	ws = mrc_peer_state.lookup(&peer_id);
	if (!ws || *peer_path_acked(ws, path_id) > after)
		return;
	/* the window failover judges the path by, read without halving it */
	window = peer_ack_window(&ws->acks, cfg) + FATE_WHO_ALLOW_NS(who);
	if (ws->acks.max_ns <= w + window)
		return;
	/* one CPU judges it; the next send through the hop is watched */
	if (!__sync_bool_compare_and_swap(wns, w, 0))
		return;
	h->until_ns = now + hold;
	h->suspect_ns = w;
	h->lone_ns = 0;
	__sync_fetch_and_add(&h->suspects, 1);
	__sync_fetch_and_add(&h->watch_suspects, 1);
}

/* Both watches (the second: another peer's send taken while the first
 * is unheard, so a hole is judged by whichever peer reports sooner). */
static __always_inline void shared_fate_watch(const struct mrc_config *cfg, struct mrc_hop *h,
					      __u64 now)
{
	shared_fate_watch_one(cfg, h, &h->watch_ns, &h->watch_who, &h->watch_after_ns, now);
	if (h->suspect_ns && now < h->until_ns)
		return;
	shared_fate_watch_one(cfg, h, &h->watch2_ns, &h->watch2_who, &h->watch2_after_ns, now);
}

/* Is the watch slot free for a new send: empty, given up after a hold,
 * or its send heard (`st`: the sender's state, when the watch is its).
 * 0: busy (being rewritten, or unheard). */
static __always_inline int shared_fate_watch_free(__u64 w, __u64 who, __u64 after,
						  struct mrc_peer_state *st, __u32 peer_id,
						  __u64 hold, __u64 now)
{
	struct mrc_peer_state *ws;
	__u32 wpeer;

	if (w == FATE_WATCH_BUSY)
		return 0;
	if (!w || now >= w + hold)
		return 1;
	wpeer = FATE_WHO_PEER(who);
	ws = wpeer == peer_id ? st : mrc_peer_state.lookup(&wpeer);
	return !ws || *peer_path_acked(ws, who & 0xffff) > after;
}

/*
 * As a packet leaves on the path (`index`, its row's: names its hop;
 * `before`: the path's last send before it): it becomes the hop's
 * watched send unless the one watched has not been heard yet (the oldest unheard send is the one to judge);
 * then, if that one is another peer's, it may take the second watch
 * (free or heard): a verdict waits for the watched peer's report, and
 * peers report at different times.  A watch
 * held for a hold without a verdict (its peer went quiet) is given up.  Not
 * probes (they go where packets are lost: their hop is judged by the
 * path's own rule), nor sends to a peer that never sent feedback (no
 * verdict is possible).  At most two peer_state lookups.
 */
static __always_inline void shared_fate_sent(const struct mrc_config *cfg, __u32 index,
					     struct mrc_peer_state *st, struct mrc_row_state *rs,
					     __u32 peer_id, __u16 path_id,
					     int probe, __u64 before, __u64 now)
{
	__u64 hold = (__u64)cfg->probe_us * 1000 * MRC_FATE_HOLD_FACTOR;
	__u64 allow_us = peer_path_queue_allowance(cfg, rs, path_id, now) / 1000;
	struct mrc_path_fate *pf;
	struct mrc_hop *h;
	__u64 w, who, *wns, *wwho, *wafter;

	if (!cfg->shared_fate || probe || !st->acks.last_ns)
		return;
	pf = mrc_path_fate.lookup(&index);
	h = shared_fate_hop(pf);
	if (!h)
		return;
	w = h->watch_ns;
	who = h->watch_who;
	wns = &h->watch_ns;
	wwho = &h->watch_who;
	wafter = &h->watch_after_ns;
	if (!shared_fate_watch_free(w, who, h->watch_after_ns, st, peer_id, hold, now)) {
		if (w == FATE_WATCH_BUSY || FATE_WHO_PEER(who) == peer_id)
			return;
		w = h->watch2_ns;
		if (!shared_fate_watch_free(w, h->watch2_who, h->watch2_after_ns, st, peer_id, hold, now))
			return;
		wns = &h->watch2_ns;
		wwho = &h->watch2_who;
		wafter = &h->watch2_after_ns;
	}
	/* written under a busy mark, so a judge never pairs one send's
	 * time with another's peer */
	if (!__sync_bool_compare_and_swap(wns, w, FATE_WATCH_BUSY))
		return;
	if (allow_us > 0xffff)
		allow_us = 0xffff;	/* 65 ms: the window is the longer anyway */
	*wwho = allow_us << 48 | (__u64)peer_id << 16 | path_id;
	*wafter = before;
	asm volatile("" ::: "memory");	/* who before its time (x86 keeps store order) */
	*wns = now;
}

/*
 * An up path's verdict: 0, its hop is not suspect or the peer heard it
 * since the suspicion began (`acked`: peer_acks.ns); FATE_PROBE_NOW, this
 * packet's turn tests it with a probe copy; else the send time of its
 * probe, not yet heard: the path is skipped, and the caller judges it by
 * the probe as by its oldest unacknowledged send (taken out when the
 * peer has heard sends a window later on other paths).
 */
static __always_inline __u64 shared_fate_check(const struct mrc_config *cfg, __u32 index,
					       __u64 *probe_ns, __u64 acked, __u64 now)
{
	struct mrc_path_fate *pf;
	struct mrc_hop *h;
	__u64 since, sent;

	if (!cfg->shared_fate)
		return 0;
	pf = mrc_path_fate.lookup(&index);
	h = shared_fate_hop(pf);
	if (!h || !pf)
		return 0;
	since = h->suspect_ns;
	if (!since || now >= h->until_ns) {
		/* not suspect: is the hop's watched send overdue? */
		shared_fate_watch(cfg, h, now);
		since = h->suspect_ns;
		if (!since || now >= h->until_ns)
			return 0;
	}
	if (acked >= since)
		return 0;
	sent = *probe_ns;	/* the peer's own (learnt state): rows are shared */
	if (sent >= since)
		return sent;
	/* one CPU sends the probe; the others skip the path (a send time
	 * is never 1: the clock has run for more than a nanosecond) */
	return __sync_bool_compare_and_swap(probe_ns, sent, now) ? FATE_PROBE_NOW : now;
}

#endif
