/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Feedback between two hosts that both run mrc-ebpf, piggybacked on the
 * MRC TLV of the packets they send each other anyway (TCP's ACKs, the
 * reverse half of a request/response):
 *   the receiver measures each of the sender's paths (rx_paths) and, in
 *   each packet it sends back, reports on one path exactly (delay, loss,
 *   newest send heard: see feedback_fill_heard for which) and
 *   acknowledges every other path it heard from since its last report; the
 *   sender files that in path_health, which the adaptive policy reads,
 *   and in peer_acks, which failover reads (lib/failover.h).
 * Paths are reported as often as they are used, at a cost per report
 * that does not grow with the number of paths.
 */
#ifndef MRC_LIB_FEEDBACK_H
#define MRC_LIB_FEEDBACK_H

#include "lib/counters.h"
#include "lib/compiler.h"
#include "lib/failover.h"
#include "lib/peer_state.h"

/*
 * RX: a sender we have not answered for fb_interval (or since our port
 * status changed: lib/ports.h) is owed feedback; if
 * no packet of ours goes its way soon, mrc_fb makes one (one-way traffic).
 * PEER: the sender's entry, as rx_track found it.
 */
static __always_inline void feedback_due(const __u8 *src_sid, struct mrc_rx_peer *peer,
					 const struct mrc_config *cfg, __u64 now)
{
	struct mrc_sid sid;
	struct mrc_peer_state *st;
	__u32 *peer_id;

	/* our port status changed since it was last owed feedback: owed
	 * now, whatever the interval (the news is in every TLV we send) */
	if (!peer || (now - peer->fb_sent_ns < (__u64)cfg->fb_interval_us * 1000 &&
		      peer->ports_told == (__u8)cfg->ports_down))
		return;
	peer->ports_told = cfg->ports_down;
	/* owed from now: fb_due stays set until mrc_fb answers, so the
	 * lookups below run once an interval, not on every packet (60 ns of
	 * RX's ~270 when they ran each time, BPF_PROG_TEST_RUN) */
	peer->fb_sent_ns = now;
	__builtin_memcpy(sid.addr, src_sid, 16);
	peer_id = mrc_peer_by_sid.lookup(&sid);
	if (!peer_id)
		return;		/* not a configured peer: we have no path to answer on */
	st = peer_state_get(*peer_id);
	if (st && !st->fb_due)
		st->fb_due = 1;
}

/* The index of the lowest set bit of w (w != 0), without branches: the
 * number of ones below it. */
static __always_inline __u32 feedback_lowest_bit(__u64 w)
{
	__u64 x = (w & -w) - 1;

	x = x - ((x >> 1) & 0x5555555555555555ULL);
	x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
	x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
	return (__u32)((x * 0x0101010101010101ULL) >> 56);
}

/*
 * TX: a path with a loss not yet reported, and forget that it has one
 * (`consume`); -1 if none.  The sender's adaptive policy should hear of a
 * loss with our next packet, so such a path is the one reported exactly.
 */
static __always_inline int feedback_take_loss(struct mrc_rx_peer *peer, int consume)
{
	__u32 i, bit;

#pragma unroll
	for (i = 0; i < MRC_MAX_PATHS / 64; i++) {
		if (peer->loss_news[i]) {
			bit = feedback_lowest_bit(peer->loss_news[i]);
			if (consume)
				peer->loss_news[i] &= ~(1ULL << bit);
			return i * 64 + bit;
		}
	}
	return -1;
}

/*
 * TX: acknowledge every path heard in the next block with news (rotating
 * over the blocks), with the block's one lower bound (lib/rx_track.h,
 * rx_track_heard): a path's acknowledgement is then about one report
 * interval old, however many paths the peer sprays over.  The path to
 * report exactly: one with a loss not yet told (`lossy`), else one whose
 * send would have dragged the bound (a slow path), else -1 (the caller
 * reports the path heard last: how far we have heard the peer, the
 * sooner a black hole elsewhere is seen).  Without `consume` (a probe)
 * the same is reported and left for the next report too.
 */
static __always_inline int feedback_fill_heard(struct mrc_tlv *tlv, struct mrc_rx_peer *peer,
					       int lossy, int consume)
{
	__u64 heard = 0, slow;
	__u32 i, block = 0;

#pragma unroll
	for (i = 0; i < MRC_MAX_PATHS / 64; i++) {
		block = (peer->fb_block + i) & (MRC_MAX_PATHS / 64 - 1);
		heard = peer->heard[block];
		if (heard)
			break;
	}
	if (heard) {
		/* the bound after the bits: written before them (rx_track_heard) */
		asm volatile("" ::: "memory");
		tlv->fb_block = block;
		tlv->fb_heard = mrc_htonll(heard);
		tlv->fb_since_ns32 = bpf_htonl((__u32)peer->heard_since[block]);
		/* a path that joined meanwhile stays for the next report */
		if (consume && !(__sync_fetch_and_and(&peer->heard[block], ~heard) & ~heard))
			peer->fb_block = block + 1;
	}
	if (lossy >= 0)
		return lossy;
#pragma unroll
	for (i = 0; i < MRC_MAX_PATHS / 64; i++) {
		slow = peer->heard_slow[i];
		if (slow) {
			slow &= -slow;
			if (consume)
				peer->heard_slow[i] &= ~slow;
			return i * 64 + feedback_lowest_bit(slow);
		}
	}
	return -1;
}

/*
 * TX: fill fb_* with what we saw from the peer whose SID is `peer_sid`.
 * A report's news (paths heard, a loss, a slow path) is told once; a
 * probe (`probe`: a down or suspect path tested, which may well be a
 * black hole, while another may be up: path_choice.keep_news; a packet
 * failing open is the news's only carrier and tells it as any other)
 * tells it too but leaves it for the next packet, so a
 * report lost with a probe costs the live paths no acknowledgement (once
 * lost, they were taken out in turn: ~1300 downs in the shared-fate
 * bench), and what a probe's report says still counts when it arrives
 * (a slow path's late packets, test_late_packets_widen_the_window).
 */
static __always_inline void feedback_fill(struct mrc_tlv *tlv, const struct mrc_sid *peer_sid, int probe,
					  __u64 now)
{
	struct mrc_rx_key key = {};
	struct mrc_rx_peer *peer;
	struct mrc_rx_path *path;
	__u64 lost, ce, ce_bit, *ce_word;
	int exact;

	peer = mrc_rx_peers.lookup((struct mrc_sid *)peer_sid);
	if (!peer)
		return;
	tlv->flags |= MRC_F_FEEDBACK;
	exact = feedback_fill_heard(tlv, peer, feedback_take_loss(peer, !probe), !probe);
	/* a CE mark, after a loss and a slow path (their acknowledgement
	 * keeps a live path up; a mark only steers the spray), and after the
	 * path heard last if it has one (what was reported before marks
	 * were: when every path is marked, reports go on as they did): a
	 * marked path of the same block of 64 as the path heard last (one
	 * word, not a walk: the TX program's verifier budget; a path of
	 * another block is told when it is heard last).  A report that
	 * names a marked path says so (MRC_F_FB_CE), once. */
	if (exact < 0) {
		ce = peer->ce_news[(peer->last_path_id / 64) & (MRC_MAX_PATHS / 64 - 1)];
		if (ce && !(ce & (1ULL << (peer->last_path_id & 63))))
			exact = (peer->last_path_id & ~63) + feedback_lowest_bit(ce);
	}
	__builtin_memcpy(key.sid, peer_sid->addr, 16);
	key.path_id = exact >= 0 ? exact : peer->last_path_id;
	ce_bit = 1ULL << (key.path_id & 63);
	ce_word = &peer->ce_news[(key.path_id / 64) & (MRC_MAX_PATHS / 64 - 1)];
	if (*ce_word & ce_bit) {
		tlv->flags |= MRC_F_FB_CE;
		if (!probe)
			__sync_fetch_and_and(ce_word, ~ce_bit);
	}
	if (!probe)	/* a probe does not answer: mrc_fb may still owe one */
		peer->fb_sent_ns = now;
	tlv->fb_path_id = bpf_htons(key.path_id);
	path = mrc_rx_paths.lookup(&key);
	if (!path)
		return;		/* forgotten (LRU): no exact time, qdelay or loss to tell */
	if (!tlv->fb_path_tx32)
		tlv->fb_path_tx32 = bpf_htonl((__u32)path->latest_tx);
	tlv->fb_qdelay_us = bpf_htons(path->qdelay_us > 0xffff ? 0xffff : path->qdelay_us);
	/* gaps that late packets have not filled: reordering on one path
	 * (two CPUs) is not loss */
	lost = path->lost > path->late ? path->lost - path->late : 0;
	tlv->fb_lost = bpf_htonl((__u32)lost);
}

/*
 * RX: the peer heard, on each path of `heard`, a packet we sent at or
 * after `since32` (the low 32 bits of our clock): file that per path.
 */
/* Our clock, from its low 32 bits echoed back (less than 4.29 s old). */
static __always_inline __u64 feedback_widen_ns(__u32 low, __u64 now)
{
	return now - (__u32)((__u32)now - low);
}

/*
 * A down path whose send from before the down (at or after the last one
 * before it) is acknowledged now was late, not dead: noted here, where the
 * exact send time is known (a probe's acknowledgement would hide it),
 * and acted on by the next failover_path_check.
 */
static __always_inline void feedback_late(struct mrc_row_state *rs, __u16 path_id, __u64 exact,
					  __u64 now)
{
	struct mrc_path_state *ps = row_path(rs, path_id);
	struct mrc_path_live *live = &ps->live;
	__u64 down;

	if (exact > ps->heard_ns)
		ps->heard_ns = exact;
	down = live->down_ns;
	if (down && exact >= live->down_after_ns && exact < down)
		live->late_ns = now;
}

static __always_inline void feedback_ack(struct mrc_peer_state *st, struct mrc_row_state *rs,
					 __u32 block, __u64 heard,
					 __u32 since32, __u16 path_id, __u32 path_tx32, __u64 now)
{
	struct mrc_peer_acks *acks = &st->acks;
	__u32 base = (block & (MRC_MAX_PATHS / 64 - 1)) * 64, bit;
	__u64 since = feedback_widen_ns(since32, now), exact = feedback_widen_ns(path_tx32, now);
	__u64 *ns;

	acks->last_ns = now;
	/* the named path, exactly (the block's figure is a lower bound).
	 * The caller checked path_id, so clang drops the mask; a verifier
	 * that does not carry a check to a spilled copy (6.1) then sees an
	 * unbounded index: keep the mask on the register that indexes. */
	ns = peer_path_acked(st, path_id);
	if (path_tx32 && *ns < exact)
		*ns = exact;
	if (path_tx32 && rs)
		feedback_late(rs, path_id, exact, now);
	if (exact > acks->max_ns && path_tx32)
		acks->max_ns = exact;
	if (!heard)
		return;
	if (since > acks->max_ns)
		acks->max_ns = since;
#pragma unroll
	for (bit = 0; bit < 64; bit++) {
		ns = &st->clocks[(base + bit) & (MRC_MAX_PATHS - 1)].acked_ns;
		if ((heard & (1ULL << bit)) && *ns < since)
			*ns = since;
	}
}

/* RX: file the feedback a peer sent us about our paths to it. */
static __always_inline void feedback_file(const __u8 *src_sid, const struct mrc_tlv *tlv, __u64 now)
{
	struct mrc_path_health *health;
	struct mrc_peer_state *st;
	struct mrc_row_state *rs;
	struct mrc_sid sid;
	__u32 *peer_id, lost;
	__u16 path_id;

	if (!(tlv->flags & MRC_F_FEEDBACK))
		return;
	__builtin_memcpy(sid.addr, src_sid, 16);
	peer_id = mrc_peer_by_sid.lookup(&sid);
	path_id = bpf_ntohs(tlv->fb_path_id);
	if (!peer_id || path_id >= MRC_MAX_PATHS)
		return;
	st = peer_state_get(*peer_id);
	if (!st)
		return;
	/* the row's part (health, CE) is the paths', shared by the row's
	 * peers; a state RX made before TX ever sent names no row of a
	 * template's peer: that report's part is not filed */
	rs = peer_row_state(st, *peer_id);
	if (rs) {
		health = row_path_health(rs, path_id);
		lost = bpf_ntohl(tlv->fb_lost);
		if ((__s32)(lost - health->lost) > 0)
			health->loss_ns = now;
		health->lost = lost;
		health->qdelay_us = bpf_ntohs(tlv->fb_qdelay_us);
		health->updated_ns = now;
		/* congestion on the path: TX skips it (lib/failover.h, failover_skip) */
		if (tlv->flags & MRC_F_FB_CE) {
			/* and its ack clock waits longer a while (peer_path_queue_allowance) */
			health->ce_stamp = peer_ce_stamp(now);
			row_path_live(rs, path_id)->ce_reports++;
			count(MRC_RX_FB_CE);
		}
	}
	feedback_ack(st, rs, tlv->fb_block, mrc_ntohll(tlv->fb_heard),
		     bpf_ntohl(tlv->fb_since_ns32), path_id, bpf_ntohl(tlv->fb_path_tx32), now);
	count(MRC_RX_FEEDBACK);
}

#endif
