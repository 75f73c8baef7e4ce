/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Sharing a device's XDP hook.  When `mrcctl attach` finds another XDP
 * program on a device, it puts that program in mrc_xdp_chain (slot i for
 * config.devices[i]) and takes its place; mrc_rx then tail-calls it with
 * every packet it would pass up: other traffic untouched, and MRC's own
 * packets after decapsulation (what the stack would see).  Its verdict
 * is the packet's.  What mrc_rx drops never reaches it.  An empty slot
 * (or a failed tail call) falls through to XDP_PASS.
 */
#ifndef MRC_LIB_XDP_CHAIN_H
#define MRC_LIB_XDP_CHAIN_H

#include "lib/maps.h"

static __always_inline int xdp_pass_on(struct xdp_md *ctx, struct mrc_config *cfg)
{
	__u32 ifindex = ctx->ingress_ifindex;

#pragma unroll
	for (__u32 i = 0; i < MRC_MAX_DEVICES; i++) {
		if (i >= cfg->n_devices)
			break;
		if (cfg->devices[i].ifindex != ifindex)
			continue;
		if (cfg->devices[i].flags & MRC_DEV_F_XDP_CHAINED)
			mrc_xdp_chain.call(ctx, i);
		break;
	}
	return XDP_PASS;
}

#endif
