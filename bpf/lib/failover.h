/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Failover inside the datapath (see struct mrc_path_live).  No timers: a
 * path's acknowledgement deadline is checked by the next packet that
 * would take it, so a dead path is excluded by the first packet sent
 * after its deadline, microseconds later, with no user space involved.
 */
#ifndef MRC_LIB_FAILOVER_H
#define MRC_LIB_FAILOVER_H

#include "lib/maps.h"
#include "lib/event_log.h"
#include "lib/compiler.h"
#include "lib/counters.h"
#include "lib/floor.h"
#include "lib/peer_state.h"
#include "lib/shared_fate.h"

enum path_use {
	PATH_SKIP,	/* down, and not its turn to be probed */
	PATH_USE,	/* up */
	PATH_PROBE,	/* down: this packet tests it */
};

/*
 * How long a path's packet may trail the peer's acknowledgements of
 * later ones on other paths: ack_timeout, or the wider window late
 * packets taught (struct mrc_peer_acks), which halves back once it has
 * held MRC_REORDER_HOLD_NS without a late packet.
 */
static __always_inline __u64 failover_ack_window(struct mrc_peer_acks *acks, const struct mrc_config *cfg,
					__u64 now)
{
	__u64 base = (__u64)cfg->ack_timeout_us * 1000;
	__u64 wide = acks->window_ns;

	if (wide && now > acks->window_hold_ns) {
		acks->window_ns = wide / 2 > base ? wide / 2 : 0;
		acks->window_hold_ns = now + MRC_REORDER_HOLD_NS;
	}
	return peer_ack_window(acks, cfg);
}

/*
 * A path taken down turned out late, not dead: double the window, up to
 * reorder_max_us.  Doubling, as a backoff: paths whose delays differ by D
 * cost at most log2(D / ack_timeout) + 1 false downs before the window
 * covers D, and a hold later it halves back, so a black hole is again
 * seen within ack_timeout once the paths agree again.
 */
static __always_inline void failover_ack_window_widen(struct mrc_peer_acks *acks,
					     const struct mrc_config *cfg, __u64 now)
{
	__u64 max = (__u64)cfg->reorder_max_us * 1000;
	__u64 wide = 2 * failover_ack_window(acks, cfg, now);

	if (wide > max)
		wide = max;
	if (wide > acks->window_ns)
		acks->window_ns = wide;
	acks->window_hold_ns = now + MRC_REORDER_HOLD_NS;
}

/*
 * Skip (MRC's SKIP state, UET's skip of an ECN-marked EV): the peer
 * reported a CE mark on the path (live.ce_reports grew), so its queues
 * are filling: it skips its next skip_rotations turns, then is used
 * again.  A new report restarts the count.  Congestion, never failure:
 * the path stays up and keeps its acknowledgement clock.  The floor
 * holds (min_active, and at least one path not skipped): a skip
 * reserves a place in it as a down does, and gives it back with its
 * last turn; a report the floor refuses is not acted on.  O(1): one
 * compare per turn, a compare-and-swap of one word (live.skip: the
 * reports acted on << 32 | turns left) while it skips.
 */
static __always_inline int failover_skip(const struct mrc_config *cfg, struct mrc_row_state *rs,
				    const struct mrc_peer *peer, __u32 path_id, __u64 now)
{
	struct mrc_path_live *live = row_path_live(rs, path_id);
	__u64 reports = live->ce_reports, w = live->skip, n = cfg->skip_rotations, left = (__u32)w, want;

	if (reports != w >> 32 && n) {
		want = reports << 32 | n;
		if (left) {
			/* skipping already: a new report restarts the count */
			__sync_bool_compare_and_swap(&live->skip, w, want);
		} else if (floor_take_out_min(cfg, peer->template_id, rs, cfg->min_active ? cfg->min_active : 1)) {
			if (__sync_bool_compare_and_swap(&live->skip, w, want))
				failover_event_log(peer->peer_id, path_id, MRC_EV_SKIP, now, 0);
			else
				floor_release(rs);
		} else {
			__sync_bool_compare_and_swap(&live->skip, w, reports << 32);	/* refused */
		}
		w = live->skip;
		left = (__u32)w;
	}
	if (!left)
		return 0;
	/* this turn is skipped; the last one gives its floor place back */
	if (__sync_bool_compare_and_swap(&live->skip, w, w - 1) && left == 1)
		floor_release(rs);
	count(MRC_TX_SKIP);
	return 1;
}

/*
 * The budget of down paths' probes (config.probe_budget a second): per
 * first hop when the path has one (struct mrc_hop, as shared fate knows
 * them), so many peers' paths through one dead switch do not multiply
 * its probes; a path without one is held to it by its own interval
 * (failover_probe_gap).  One probe a 1 s / budget through a hop: 1 if
 * the probe copy for path `path_id` (its row's `row_index`) may go, and
 * its slot is taken; else the path is due again at once (its interval
 * not doubled), and tried by a later packet.  Once a packet, after the
 * reroute loop (the verifier's budget is the loop's).
 */
static __always_inline int failover_probe_budget(const struct mrc_config *cfg, struct mrc_row_state *rs,
						 __u32 row_index, __u16 path_id, __u64 now)
{
	struct mrc_path_live *live;
	struct mrc_path_fate *pf;
	struct mrc_hop *h;
	__u64 next;

	if (!cfg->probe_budget)
		return 1;
	pf = mrc_path_fate.lookup(&row_index);
	h = shared_fate_hop(pf);
	if (!h)
		return 1;
	next = h->probe_next_ns;
	if (now >= next &&
	    __sync_bool_compare_and_swap(&h->probe_next_ns, next, now + 1000000000ULL / cfg->probe_budget))
		return 1;
	__sync_fetch_and_add(&h->probes_held, 1);
	count(MRC_TX_PROBE_HELD);
	live = row_path_live(rs, path_id);
	live->probes--;		/* not sent after all */
	live->next_probe_ns = now;
	live->probe_gap_us >>= 1;
	return 0;
}

/* A down path's next probe interval: the last one doubled, from probe_us
 * up to probe_max_us (exponential backoff: a dead path costs ever fewer
 * probes, one a probe_max_us at most, and an answer brings it back
 * within that), never shorter than the budget allows one path. */
static __always_inline __u64 failover_probe_gap(const struct mrc_path_live *live, const struct mrc_config *cfg)
{
	/* without branches (this runs in the reroute loop, and every branch
	 * there costs the verifier a state per try): all values < 2^63 */
	__s64 probe_ns = (__u64)cfg->probe_us * 1000, max = (__u64)cfg->probe_max_us * 1000;
	__s64 gap = 2000 * (__u64)live->probe_gap_us, d;

	d = max - gap;			/* gap = min(gap, max) */
	gap += d & (d >> 63);
	d = gap - probe_ns;		/* gap = max(gap, probe_ns) */
	gap -= d & (d >> 63);
	/* and one path's share of the budget (a division by 0 is 0 in BPF) */
	d = gap - (__s64)(1000000000ULL / cfg->probe_budget);
	gap -= d & (d >> 63);
	return gap;
}

/*
 * May this packet take the path?  Applies what feedback said since the
 * last look (acknowledged: the clock stops, a down path comes back up),
 * and takes the path down when it is overdue.  Overdue is relative, as
 * RACK is for TCP: packets sent on the other paths a window *after* the
 * oldest unacknowledged one on this path have been acknowledged, so this
 * one is not merely slow, everything is not; or the peer has gone on
 * sending feedback for MRC_SILENCE_FACTOR windows without naming this
 * path.  A peer that stops talking altogether takes no path down (there is
 * nothing to compare with), and one that never sent feedback (no mrc-ebpf
 * there) has no clock at all.
 */
static __always_inline enum path_use failover_path_check(struct mrc_path_live *live,
						const struct mrc_config *cfg, struct mrc_peer_state *st,
						struct mrc_row_state *rs, const struct mrc_peer *peer,
						__u16 path_id, __u64 now, int fate)
{
	__u32 peer_id = peer->peer_id;
	/* the path's row (its template's, or the peer's own): its hop */
	__u32 row_index = peer->template_id * MRC_MAX_PATHS + path_id;
	struct mrc_peer_acks *acks = &st->acks;
	struct mrc_path_clock *clock = peer_path_clock(st, path_id);
	__u64 probe_ns = (__u64)cfg->probe_us * 1000;
	__u64 since = clock->unacked_since_ns;
	__u64 down = live->down_ns;
	__u64 acked, heard, window, probe, gap;

	if (!acks->last_ns)
		return PATH_USE;
	acked = clock->acked_ns;
	/* stopped by an acknowledgement past the send before it, or void: a
	 * send from before the path's last down (down_after_ns) was judged
	 * by that down; the path came back since, perhaps on another of the
	 * row's peers' answer, and this peer's stale clock must not take it
	 * out again */
	if (since && (acked > clock->clock_after_ns || since <= live->down_after_ns)) {
		clock->unacked_since_ns = 0;
		since = 0;
	}
	/* back up on news of the last packet before the down, or a later one,
	 * from this peer or (exactly) from any of the row's: one probe
	 * answered brings the path back for all; late if that came first
	 * (feedback_late).  max(acked, heard) without a branch (a branch
	 * here doubles the reroute loop's states): both < 2^63 */
	heard = ((struct mrc_path_state *)live)->heard_ns - acked;	/* live is its state's first member */
	heard = acked + (heard & ~((__s64)heard >> 63));
	if (down && heard >= live->down_after_ns &&
	    __sync_bool_compare_and_swap(&live->down_ns, down, 0)) {
		floor_release(rs);
		if (live->late_ns > down) {
			/* sent before the down: the path was late, not dead */
			failover_ack_window_widen(acks, cfg, now);
			failover_event_log(peer_id, path_id, MRC_EV_LATE, now, down);
		} else {
			failover_event_log(peer_id, path_id, MRC_EV_UP, now, down);
		}
		down = 0;
	}
	if (down) {
		__u64 due = live->next_probe_ns;

		gap = failover_probe_gap(live, cfg);
		if (now < due || !__sync_bool_compare_and_swap(&live->next_probe_ns, due, now + gap))
			return PATH_SKIP;
		live->probe_gap_us = gap / 1000;
		if (fate)	/* shared fate: its hop is still suspect */
			shared_fate_path_down(cfg, row_index, (__u64)peer_id << 16 | path_id, 0, now);
		return PATH_PROBE;
	}
	/* shared fate (lib/shared_fate.h): while its hop is suspect the path
	 * is skipped, tested by a probe copy and judged by that probe */
	probe = fate ? shared_fate_check(cfg, row_index, &((struct mrc_path_state *)live)->fate_probe_ns,
					 acked, now) : 0;
	if (probe == FATE_PROBE_NOW)
		return PATH_PROBE;
	if (probe && (!since || probe < since))
		since = probe;
	if (!since)
		return PATH_USE;
	window = failover_ack_window(acks, cfg, now) + peer_path_queue_allowance(cfg, rs, path_id, now);
	if (acks->max_ns > since + window || acks->last_ns > since + window * MRC_SILENCE_FACTOR) {
		/* the floor (min_active) may keep it in use: logged once per
		 * overdue send */
		if (!floor_take_out(cfg, peer->template_id, rs)) {
			if (live->kept_since_ns != since) {
				live->kept_since_ns = since;
				failover_event_log(peer_id, path_id, MRC_EV_KEPT, now, since);
			}
			return PATH_USE;
		}
		/* one CPU wins the transition and logs it */
		if (__sync_bool_compare_and_swap(&live->down_ns, 0, now)) {
			live->down_after_ns = live->last_sent_ns;
			live->next_probe_ns = now + probe_ns;
			live->probe_gap_us = cfg->probe_us;
			live->downs++;
			failover_event_log(peer_id, path_id, since == probe ? MRC_EV_SHARED_DOWN : MRC_EV_DOWN,
					   now, since);
			shared_fate_path_down(cfg, row_index, (__u64)peer_id << 16 | path_id, since == probe, now);
		} else {
			floor_release(rs);
		}
		return PATH_SKIP;
	}
	return probe ? PATH_SKIP : PATH_USE;
}

/*
 * Before each packet: a send after a pause (nothing sent to the peer for
 * more than reorder_max_us, 16 ms by default: a TCP stall, an RTO) notes
 * when, and how far the peer had heard us by then (failover_lone's
 * evidence from before the pause).  Not shorter: TCP's own pauses after a
 * loss (1-2 ms) would defer a black hole's judgment (with ack_timeout
 * here the shaped failover bench's longest gap went from 25 to 37 ms,
 * 18 runs each).
 */
static __always_inline void failover_pause(const struct mrc_config *cfg, struct mrc_peer_state *st, __u64 now)
{
	/* a new state's first packet starts the traffic, it ends no pause */
	if (st->tx.last_ns && now - st->tx.last_ns > (__u64)cfg->reorder_max_us * 1000) {
		st->acks.resume_ns = now;
		st->acks.max_at_resume_ns = st->acks.max_ns;
	}
	st->tx.last_ns = now;
}

/*
 * An unheard send that may be no silence at all is tested, not judged:
 * the packet about to take the path tests it, its clock restarted at this
 * packet (an odd ns marks a restart, so its own silence takes the path
 * down as before, and a clock restarts once), and an acknowledgement of
 * the old send or any later one stops it.  Two cases:
 * - a lone send (nothing went on the path after it, the peer has heard
 *   later sends elsewhere) on a path congested lately (CE or trims within
 *   the silence rule's 16 x reorder_max_us): one packet or its report
 *   lost to congestion, as TCP stalls after it (the incast bench's false
 *   downs came 2-107 ms after that send);
 * - a send from before a pause of ours (failover_pause) that what the
 *   peer had heard by then did not overtake, for reorder_max_us after
 *   the pause: the peer's reports on the new sends can pass the one on
 *   the old send (they take the peer's own sprayed paths; traced in the
 *   incast, it came 6-715 us after a later one that took the path down).
 * A black hole costs one packet and one window more, and only when its
 * traffic had stopped: under traffic a dead path has sends after its
 * first unheard one and no pause (tried on every lone send: a black hole
 * on an uncongested fabric was out up to 2 ms later, the restart's
 * window).  For the policy's pick only, up, before the reroute loop (the
 * verifier's budget is the loop's: in failover_path_check it took mrc_tx
 * past 1M instructions).
 */
static __always_inline void failover_lone(const struct mrc_config *cfg, struct mrc_peer_state *st,
					  struct mrc_row_state *rs, __u32 path_id, __u64 now)
{
	struct mrc_path_clock *clock = peer_path_clock(st, path_id);
	struct mrc_path_live *live = row_path_live(rs, path_id);
	__u64 stamp = row_path_health(rs, path_id)->ce_stamp;
	__u64 since = clock->unacked_since_ns;
	__u64 base = (__u64)cfg->ack_timeout_us * 1000;
	/* ~1 ms units since the path's last congestion news (mod 2^16) */
	__u64 age = ((now >> MRC_CE_STAMP_SHIFT) - stamp) & 0xffff;
	__u64 fresh = ((__u64)cfg->reorder_max_us * 1000 * MRC_SILENCE_FACTOR) >> MRC_CE_STAMP_SHIFT;
	int lone_congested, before_pause;

	if (!since || (since & 1) || live->down_ns)
		return;
	if (fresh > 0x7fff)
		fresh = 0x7fff;		/* half the stamp's 68.7 s wrap */
	lone_congested = (live->last_sent_ns | 1) == (since | 1) && st->acks.max_ns > since + base &&
			 stamp && age <= fresh;
	before_pause = since < st->acks.resume_ns && st->acks.max_at_resume_ns <= since + base &&
		       now - st->acks.resume_ns <= (__u64)cfg->reorder_max_us * 1000;
	if (!lone_congested && !before_pause)
		return;
	clock->clock_after_ns = since - 1;
	clock->unacked_since_ns = now | 1;
}

/* After a packet left on the path: start its acknowledgement clock, if
 * the peer has ever acknowledged anything (else there is no clock: a
 * clock started before the peer's first feedback would run out on it). */
static __always_inline void failover_path_sent(struct mrc_path_live *live, struct mrc_path_clock *clock,
					      struct mrc_peer_state *st, __u64 now)
{
	__u64 before = live->last_sent_ns;

	live->last_sent_ns = now;
	if (clock->unacked_since_ns)
		return;
	if (st->acks.last_ns) {
		clock->clock_after_ns = before;
		clock->unacked_since_ns = now & ~1ULL;	/* even: a send (failover_path_check) */
	}
}

#endif
