/* SPDX-License-Identifier: GPL-2.0 */
/*
 * MRC's ev_min_active: a floor of usable paths per row (a template's
 * peers share their paths' states).  The loader counts the row's paths
 * that may be used (state UP, not denied); the datapath counts how many
 * of them it has taken out (row_state.floor_out).  A path is taken
 * out only by reserving a place in that count first, so two CPUs taking
 * two paths out at once cannot both pass the floor.  O(1), one atomic
 * add per transition, none per packet while the floor is not reached.
 */
#ifndef MRC_LIB_FLOOR_H
#define MRC_LIB_FLOOR_H

#include "lib/maps.h"
#include "lib/peer_state.h"

/* May one more of the peer's paths be taken out?  1: yes, and it is
 * counted (floor_release() undoes it if the transition is lost); 0: no,
 * the peer would be left with fewer than min_active usable paths. */
static __always_inline int floor_take_out_min(const struct mrc_config *cfg, __u32 template_id,
					      struct mrc_row_state *rs, __u64 min)
{
	struct mrc_peer_floor *f = mrc_peer_floor.lookup(&template_id);
	__u64 before;

	if (!f)
		return 1;
	if (min && f->usable < min + rs->floor_out + 1)
		return 0;	/* the common refusal, without an atomic */
	before = __sync_fetch_and_add(&rs->floor_out, 1);
	if (min && f->usable < min + before + 1) {
		__sync_fetch_and_add(&rs->floor_out, -1);	/* no fetch: plain XADD, any kernel */
		return 0;
	}
	return 1;
}

static __always_inline int floor_take_out(const struct mrc_config *cfg, __u32 template_id,
					  struct mrc_row_state *rs)
{
	return floor_take_out_min(cfg, template_id, rs, cfg->min_active);
}

/* A path taken out is back (or the transition went to another CPU). */
static __always_inline void floor_release(struct mrc_row_state *rs)
{
	if (rs->floor_out)
		__sync_fetch_and_add(&rs->floor_out, -1);
}

#endif
