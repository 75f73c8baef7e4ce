/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Sending an encapsulated packet to its path's first hop.  The kernel
 * already chose MACs for the next hop of the peer prefix's route; most
 * paths share it and leave as they are.  A path with another first hop
 * (another router, another plane's device) goes to it with
 * bpf_redirect_neigh(), which resolves the neighbour as the stack would.
 */
#ifndef MRC_LIB_NEXTHOP_H
#define MRC_LIB_NEXTHOP_H

#include "lib/counters.h"

#ifndef AF_INET6
#define AF_INET6 10
#endif

/* bcc 0.26 declares the older three-argument form of this helper. */
static long (*mrc_redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params,
				  int plen, __u64 flags) = (void *)BPF_FUNC_redirect_neigh;

/* `control`: a feedback packet made from a received one, whose MACs are
 * still those it arrived with: always resolved afresh. */
static __always_inline int nexthop_send(const struct mrc_path *path, int control)
{
	struct bpf_redir_neigh nh = { .nh_family = AF_INET6 };

	if (!(path->flags & MRC_PATH_F_REDIRECT) && !control)
		return TC_ACT_OK;
	__builtin_memcpy(nh.ipv6_nh, path->nexthop, 16);
	count(MRC_TX_REDIRECT);
	return mrc_redirect_neigh(path->oif, &nh, sizeof(nh), 0);
}

#endif
