/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Sending an encapsulated packet towards its first segment.  The kernel
 * chose the next hop for the inner destination; the outer one may differ,
 * so look it up again and fix the MACs (and the device) to match.
 */
#ifndef MRC_LIB_FIB_H
#define MRC_LIB_FIB_H

#include "lib/counters.h"

#ifndef AF_INET6
#define AF_INET6 10
#endif

/* bcc 0.26 declares the older three-argument form of this helper. */
static long (*mrc_redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params,
				  int plen, __u64 flags) = (void *)BPF_FUNC_redirect_neigh;

/* Sends the packet where its (outer) IPv6 header says. */
static __always_inline int fib_forward(struct __sk_buff *skb)
{
	struct bpf_fib_lookup fib = {};
	struct bpf_redir_neigh nh = {};
	int rc;

	fib.family = AF_INET6;
	fib.ifindex = skb->ifindex;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, saddr),
			       fib.ipv6_src, 16) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, daddr),
			       fib.ipv6_dst, 16))
		goto miss;

	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_OUTPUT);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		bpf_skb_store_bytes(skb, 0, fib.dmac, ETH_ALEN, 0);
		bpf_skb_store_bytes(skb, ETH_ALEN, fib.smac, ETH_ALEN, 0);
		if (fib.ifindex == skb->ifindex)
			return TC_ACT_OK;
		count(MRC_TX_FIB_REDIRECT);
		return bpf_redirect(fib.ifindex, 0);
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		/* fib.ipv6_dst now holds the next hop */
		nh.nh_family = AF_INET6;
		__builtin_memcpy(nh.ipv6_nh, fib.ipv6_dst, 16);
		count(MRC_TX_NEIGH_REDIRECT);
		return mrc_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	}
miss:
	/* No route to the first segment: leave the MACs the kernel chose
	 * for the inner destination and let the packet go. */
	count(MRC_TX_FIB_MISS);
	return TC_ACT_OK;
}

#endif
