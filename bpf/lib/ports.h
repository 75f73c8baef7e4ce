/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Port status (issue 29; MRC's Port Status Update): a peer tells us, in
 * every TLV it sends (mrc_tlv.ports_down), which of its planes' devices
 * are down; `mrcctl ports watch` on its side sets the bits from the
 * kernel's link events and sends one feedback-only packet to each peer
 * at once (mrc_ebpf/control/ports.py).  Plane i is device i of an
 * attachment on every host alike.
 *
 * Our own devices count alike: a plane is down for a peer when its
 * device of it is down or ours is (config.ports_down, which the kernel
 * hooks of bpf/mrc_ports.c set the instant ours goes), so our own sends
 * stop using our dead plane with the next packet from each peer (its
 * data or its feedback), with no walk over every peer at the event.
 *
 * RX: when a sender's bits change (the last filed is rx_peers.ports_down,
 * read on every packet anyway: one compare), the paths of ours to it
 * whose own device is of a plane that went down are taken out at once:
 * down as failover takes a path down (probed, brought back by an
 * acknowledged probe), but with down_after_ns at the news, so only a
 * send after it (a probe) can bring it back.  A plane that came back
 * gets its down paths probed at once.  The walk over the peer's paths
 * happens only at a change, never per packet; TX is untouched but for
 * the byte it sends and the row it notes in a new peer state
 * (lib/peer_state.h).
 */
#ifndef MRC_LIB_PORTS_H
#define MRC_LIB_PORTS_H

#include "lib/maps.h"
#include "lib/compiler.h"
#include "lib/counters.h"
#include "lib/floor.h"
#include "lib/peer_state.h"
#include "lib/failover.h"
#include "lib/feedback.h"

/* 1 if x is 0, else 0, without a branch */
static __always_inline __u64 ports_is_zero(__u64 x)
{
	return ((x | -x) >> 63) ^ 1;
}

/* `old`, or `now` where the mask m is all ones: without a branch */
static __always_inline __u64 ports_pick(__u64 m, __u64 now, __u64 old)
{
	return (now & m) | (old & ~m);
}

#define PORTS_WALKING	0x80000000	/* rx_peers.ports_walk: a walk is under way */
#define PORTS_CHUNK	32		/* path ids a packet walks (a power of two) */
#define PORTS_CHUNK_MASK ((1ULL << PORTS_CHUNK) - 1)

/* The lowest path id at or after `from` with a bit in the plane's four
 * words, or MRC_MAX_PATHS: without a branch */
static __always_inline __u32 ports_next(const struct mrc_peer_floor *f, __u32 plane, __u32 from)
{
	__u64 word, nz;
	__s64 d;
	__u32 w, next = MRC_MAX_PATHS;

#pragma unroll
	for (w = 4; w-- > 0;) {
		d = (__s64)from - w * 64;
		d &= ~(d >> 63);			/* max(d, 0) */
		word = f->plane_paths[plane].ids[w];
		word &= (~0ULL << (d & 63)) & -(__u64)(((d - 64) >> 63) & 1);	/* ids >= from */
		nz = 1 ^ ports_is_zero(word);
		next = ports_pick(-nz, w * 64 + feedback_lowest_bit(word | (1ULL << 63)), next);
	}
	return next;
}

/*
 * One packet's share of a walk: the next chunk of PORTS_CHUNK path ids
 * with paths of the plane in them.  Our paths to the peer that leave by
 * our device of that plane (peer_floor.plane_paths, which the loader
 * keeps) are taken out if up (`down`), or probed at once if out and the
 * plane came back.  The body has no branch, and a packet walks one chunk:
 * inlined wherever a TLV is filed, the verifier goes through it for each
 * of its states there (256 path ids a packet took it past 1M).  Returns
 * 1 when the walk is over.  A port down takes paths out below the floor
 * (min_active) too, as they can carry nothing; they count in it, as any
 * path taken out.  One event (MRC_EV_PORT_DOWN) per chunk that took
 * paths out, its path_id MRC_EV_PLANE + the plane.
 */
static __always_inline int ports_walk(const __u8 *src_sid, __u32 walk, __u64 now, __u32 *next)
{
	__u32 zero = 0, *peer_id, row, i, j, plane = walk & (MRC_MAX_DEVICES - 1), chunk, first;
	int down = (walk >> 8) & 1;
	struct mrc_config *cfg;
	struct mrc_peer_state *st;
	struct mrc_row_state *rs;
	struct mrc_peer_floor *f;
	struct mrc_path_live *live;
	struct mrc_sid sid;
	__u64 bits, bit, m, taken = 0, probe_ns;

	cfg = mrc_config.lookup(&zero);
	__builtin_memcpy(sid.addr, src_sid, 16);
	peer_id = mrc_peer_by_sid.lookup(&sid);
	if (!cfg || !peer_id)
		return 1;
	st = peer_state_find(*peer_id);
	if (!st)
		return 1;	/* never sent to: nothing to stop */
	row = st->row1 ? st->row1 - 1 : *peer_id;
	f = mrc_peer_floor.lookup(&row);
	rs = row_state_get(row);
	if (!f || !rs)
		return 1;
	/* the chunk of the first path from where the last packet stopped */
	first = ports_next(f, plane, (walk >> 16) & 0x1ff);
	if (first >= MRC_MAX_PATHS)
		return 1;
	chunk = first / PORTS_CHUNK;
	/* the check above bounds a spilled copy only on 6.1: keep the mask
	 * on the register that indexes */
	barrier_var(chunk);
	chunk &= MRC_MAX_PATHS / PORTS_CHUNK - 1;
	bits = (f->plane_paths[plane].ids[(chunk / (64 / PORTS_CHUNK)) & 3] >>
		(chunk % (64 / PORTS_CHUNK) * PORTS_CHUNK)) & PORTS_CHUNK_MASK;
	probe_ns = (__u64)cfg->probe_us * 1000;
#pragma clang loop unroll(disable)
	for (j = 0; j < PORTS_CHUNK; j++) {
		i = chunk * PORTS_CHUNK + j;
		bit = (bits >> j) & 1;
		live = row_path_live(rs, i);
		if (down) {
			bit &= ports_is_zero(live->down_ns);	/* up ones only */
			m = -bit;
			/* down_after_ns at the news: only a send after it (a
			 * probe) acknowledged brings the path back */
			live->down_after_ns = ports_pick(m, now, live->down_after_ns);
			live->next_probe_ns = ports_pick(m, now + probe_ns, live->next_probe_ns);
			live->probe_gap_us = ports_pick(m, cfg->probe_us, live->probe_gap_us);
			live->down_ns = ports_pick(m, now, live->down_ns);
			live->downs += bit;
			taken += bit;
		} else {
			m = -(bit & (ports_is_zero(live->down_ns) ^ 1));	/* out ones: probed now */
			live->next_probe_ns = ports_pick(m, now, live->next_probe_ns);
		}
	}
	if (taken) {
		__sync_fetch_and_add(&rs->floor_out, taken);
		count_add(MRC_RX_PORT_DOWN_PATHS, taken);
		failover_event_log(*peer_id, MRC_EV_PLANE + plane, MRC_EV_PORT_DOWN, now, 0);
	}
	*next = (chunk + 1) * PORTS_CHUNK;
	return 0;	/* the next packet finds whether more are left */
}

/*
 * RX, per filed TLV: one compare with what was filed last
 * (rx_peers.ports_down: the sender's port status | ours).  A change starts a walk of one plane (the
 * lowest that changed), which this packet and the next ones carry on
 * (rx_peers.ports_walk: PORTS_WALKING | the next chunk << 16 | down << 8
 * | the plane) until the plane's paths are done; the filed bit flips
 * then, and the next packet starts the next plane's if another changed.
 */
static __always_inline void ports_file(struct mrc_rx_peer *peer, const __u8 *src_sid,
				       const struct mrc_tlv *tlv, __u64 now)
{
	__u32 zero = 0, walk = peer->ports_walk, plane, next = 0;
	struct mrc_config *cfg = mrc_config.lookup(&zero);
	/* a plane is down for this peer if its device of it is down, or
	 * ours is (the kernel hooks set config.ports_down: bpf/mrc_ports.c):
	 * the same paths are dead either way */
	__u8 down = tlv->ports_down | (cfg ? cfg->ports_down : 0);
	__u8 changed = peer->ports_down ^ down;

	if (!walk) {
		if (!changed)
			return;
		plane = feedback_lowest_bit(changed) & (MRC_MAX_DEVICES - 1);
		walk = PORTS_WALKING | ((down >> plane) & 1) << 8 | plane;
		count(MRC_RX_PORT_STATUS);
	}
	if (ports_walk(src_sid, walk, now, &next)) {
		peer->ports_down ^= 1 << (walk & (MRC_MAX_DEVICES - 1));
		peer->ports_walk = 0;
	} else {
		peer->ports_walk = (walk & 0xffff) | (next & 0x1ff) << 16;
	}
}

#endif
