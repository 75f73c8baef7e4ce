/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Trimmed packets (issue 29): a fabric switch whose queue passed a
 * threshold cut the packet to its headers (outer IPv6, SRH or
 * Destination Options with the MRC TLV, inner IP header) and set the
 * outer DSCP to MRC_TRIM_DSCP (bpf/lab/trim.c is the lab's switch).
 *
 * The receiver (mrc_rx, XDP) sees a packet valid up to its whole inner
 * header, whose length claims more than is left: with that DSCP, it is a
 * trim, not a broken packet.  Its TLV is filed as any (rx_file: authentic,
 * fresh), so its sequence number is no gap (the loss we report excludes
 * trims) and its send is acknowledged (the path is alive: congested,
 * never assumed bad); then counted per path (rx_paths.trimmed) and
 * noted as congestion news for the next report on the path, which says
 * MRC_F_FB_CE: the sender skips the path (lib/failover.h).  That report
 * goes at once: the packet is stripped to its inner header and handed,
 * with MRC_TRIM_META in its XDP metadata, to mrc_fb (TC ingress), which
 * clones it into a feedback-only packet to the sender (lib/control.h)
 * and drops it.  Nothing trimmed reaches the stack.
 *
 * RX logic lives here, not in mrc_rx(): the helpers take what the
 * checks found, so an RX at TC ingress can call them too.
 */
#ifndef MRC_LIB_TRIM_H
#define MRC_LIB_TRIM_H

#include "lib/counters.h"
#include "lib/maps.h"
#include "lib/ecn.h"

/*
 * Was the packet, which rx_check found broken for `reason`, trimmed?
 * Only what a switch's cut explains may be wrong: the inner header is
 * whole and of its version, and claims more than is left of the packet;
 * and the mark is set.  Anything else broken is dropped as before.
 */
static __always_inline int trim_marked(const struct ipv6hdr *ip6, void *data_end, __u32 reason,
				       const struct mrc_tlv *mrc, __u8 inner_nexthdr, __u32 outer_len,
				       __u32 inner_len)
{
	void *inner = (void *)ip6 + (outer_len & 0xfff);

	if (reason != MRC_RX_DROP_INNER_HEADER || !mrc ||
	    ((ip6->priority << 2) | (ip6->flow_lbl[0] >> 6)) != MRC_TRIM_DSCP)
		return 0;
	if (inner_nexthdr == IPPROTO_IPV6) {
		struct ipv6hdr *in6 = inner;

		return (void *)(in6 + 1) <= data_end && in6->version == 6 &&
		       bpf_ntohs(in6->payload_len) + sizeof(*in6) > inner_len;
	}
	struct iphdr *in4 = inner;

	return (void *)(in4 + 1) <= data_end && in4->version == 4 && in4->ihl >= 5 &&
	       in4->ihl * 4 <= inner_len && bpf_ntohs(in4->tot_len) > inner_len;
}

/* After rx_file filed its TLV: the trim counted on its path and told
 * in the next report that names the path (as a CE mark is). */
static __always_inline void trim_note(const __u8 *src_sid, const struct mrc_tlv *mrc)
{
	struct mrc_rx_key key = {};
	struct mrc_rx_path *p;
	struct mrc_rx_peer *peer;
	__u16 path_id = bpf_ntohs(mrc->path_id);

	__builtin_memcpy(key.sid, src_sid, 16);
	key.path_id = path_id;
	p = mrc_rx_paths.lookup(&key);
	if (p)
		__sync_fetch_and_add(&p->trimmed, 1);
	peer = mrc_rx_peers.lookup((struct mrc_sid *)key.sid);
	if (peer) {
		/* the path the report names when nothing else is news */
		peer->last_path_id = path_id;
		__sync_fetch_and_or(&peer->ce_news[(path_id / 64) & (MRC_MAX_PATHS / 64 - 1)],
				    1ULL << (path_id & 63));
	}
}

/*
 * The trimmed packet (filed or not) goes to mrc_fb as its inner header
 * alone, marked in its metadata: XDP_PASS, or XDP_DROP when that cannot
 * be done (no feedback then: the next packet carries it).  Counted here,
 * once, as the packet's outcome.
 */
static __always_inline int trim_hand_on(struct xdp_md *ctx, __u32 outer_len, __u8 inner_nexthdr,
					int filed)
{
	void *data, *data_end, *meta;
	struct ethhdr *eth, eth_copy;

	count(MRC_RX_TRIMMED);
	if (!filed)
		return XDP_DROP;	/* nothing new to tell */
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return XDP_DROP;
	__builtin_memcpy(&eth_copy, eth, sizeof(eth_copy));
	if (bpf_xdp_adjust_head(ctx, outer_len & 0xfff))
		return XDP_DROP;
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(__u32)))
		return XDP_DROP;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	meta = (void *)(long)ctx->data_meta;
	eth = data;
	if ((void *)(eth + 1) > data_end || meta + sizeof(__u32) > data)
		return XDP_DROP;
	*(__u32 *)meta = MRC_TRIM_META;
	__builtin_memcpy(eth->h_dest, eth_copy.h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth_copy.h_source, ETH_ALEN);
	/* rx_check_inner let only these two through to the inner header */
	eth->h_proto = bpf_htons(inner_nexthdr == IPPROTO_IPV6 ? ETH_P_IPV6 : ETH_P_IP);
	return XDP_PASS;
}

/*
 * mrc_fb, TC ingress: a trimmed packet mrc_rx handed on is answered at
 * once (one feedback clone, whatever fb_interval says) and dropped
 * (TC_ACT_SHOT); anything else: -1.
 */
static __always_inline int trim_fb(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *meta = (void *)(long)skb->data_meta;
	__u32 mark;

	if (meta + sizeof(__u32) > data || *(__u32 *)meta != MRC_TRIM_META)
		return -1;
	mark = skb->mark;
	skb->mark = MRC_FB_MARK;
	if (bpf_clone_redirect(skb, skb->ifindex, 0) == 0)
		count(MRC_FB_TRIM_CLONE);
	skb->mark = mark;
	return TC_ACT_SHOT;
}

#endif
