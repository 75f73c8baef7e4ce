/* SPDX-License-Identifier: GPL-2.0 */
/*
 * RX, at XDP: a packet whose active segment is our SID is checked as a
 * whole (RFC 8754 section 4.3, and stricter than the kernel's End.DT6,
 * which takes an invalid SRH for no SRH and decapsulates anyway), then
 * stripped of its outer IPv6 + SRH and passed up as the inner packet.
 * What fails a check is dropped and counted by reason.  Packets for
 * anyone else pass untouched.
 *
 * Every packet is counted in MRC_RX_SEEN and in exactly one outcome.
 */
#include "lib/counters.h"
#include "lib/addr.h"
#include "lib/srh.h"
#include "lib/rx_track.h"
#include "lib/feedback.h"

static __always_inline int rx_pass(void)
{
	count(MRC_RX_PASS);
	return XDP_PASS;
}

static __always_inline int rx_drop(__u32 reason)
{
	count(reason);
	return XDP_DROP;
}

/* Checks the inner header against what is left of the frame; returns
 * the inner ethertype, or 0 and the drop reason in *reason. */
static __always_inline __u16 rx_check_inner(__u8 nexthdr, void *inner, void *data_end,
					    __u32 inner_len, __u32 *reason)
{
	if (nexthdr == IPPROTO_IPV6) {
		struct ipv6hdr *ip6 = inner;

		if ((void *)(ip6 + 1) > data_end || ip6->version != 6 ||
		    bpf_ntohs(ip6->payload_len) + sizeof(*ip6) != inner_len)
			goto bad;
		return ETH_P_IPV6;
	}
	if (nexthdr == IPPROTO_IPIP) {
		struct iphdr *ip4 = inner;

		if ((void *)(ip4 + 1) > data_end || ip4->version != 4 || ip4->ihl < 5 ||
		    bpf_ntohs(ip4->tot_len) != inner_len || ip4->ihl * 4 > inner_len)
			goto bad;
		return ETH_P_IP;
	}
	*reason = MRC_RX_DROP_INNER_PROTO;
	return 0;
bad:
	*reason = MRC_RX_DROP_INNER_HEADER;
	return 0;
}

int mrc_rx(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data, eth_copy;
	struct ipv6hdr *ip6;
	struct srh_fixed *srh;
	struct mrc_tlv *mrc;
	struct mrc_config *cfg;
	__u32 zero = 0, l3_len, srh_len, outer_len, inner_len, reason = 0;
	__u16 inner_proto;
	__u8 *segment0;
	int rc;

	count(MRC_RX_SEEN);

	cfg = config.lookup(&zero);
	if (!cfg)
		return rx_pass();
	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IPV6))
		return rx_pass();
	ip6 = (void *)(eth + 1);
	if ((void *)(ip6 + 1) > data_end)
		return rx_pass();
	if (!addr_equal(ip6->daddr.s6_addr, cfg->sid) || ip6->nexthdr != IPPROTO_ROUTING)
		return rx_pass();

	/* From here on the packet claims to be ours: whatever is wrong
	 * with it is dropped, never decapsulated. */
	l3_len = data_end - (void *)ip6;
	if (bpf_ntohs(ip6->payload_len) + sizeof(*ip6) != l3_len)
		return rx_drop(MRC_RX_DROP_PAYLOAD_LEN);

	srh = (void *)(ip6 + 1);
	if ((void *)(srh + 1) > data_end)
		return rx_drop(MRC_RX_DROP_TRUNCATED);
	if (srh->type != SRH_ROUTING_TYPE)
		return rx_drop(MRC_RX_DROP_ROUTING_TYPE);
	srh_len = (srh->hdrlen + 1) * 8;
	if (sizeof(*ip6) + srh_len > l3_len ||
	    sizeof(*srh) + (srh->last_entry + 1) * 16 > srh_len)
		return rx_drop(MRC_RX_DROP_SRH_LEN);
	if (srh->segments_left > srh->last_entry || srh->segments_left != 0)
		return rx_drop(MRC_RX_DROP_SEGMENTS_LEFT);

	/* Segments left is 0: the active segment is list[0] and the
	 * destination address must be it. */
	segment0 = (void *)(srh + 1);
	if ((void *)(segment0 + 16) > data_end)
		return rx_drop(MRC_RX_DROP_TRUNCATED);
	if (!addr_equal(segment0, ip6->daddr.s6_addr))
		return rx_drop(MRC_RX_DROP_ACTIVE_SEGMENT);

	rc = srh_walk_tlvs(srh, data_end, sizeof(*srh) + (srh->last_entry + 1) * 16,
			   srh_len, &mrc);
	if (rc)
		return rx_drop(rc);

	outer_len = sizeof(*ip6) + srh_len;
	inner_len = l3_len - outer_len;
	inner_proto = rx_check_inner(srh->nexthdr, (void *)ip6 + (outer_len & 0xfff),
				     data_end, inner_len, &reason);
	if (!inner_proto)
		return rx_drop(reason);
	if (mrc) {
		__u64 now = bpf_ktime_get_ns();

		count(MRC_RX_MRC_TLV);
		rx_track_path(ip6->saddr.s6_addr, mrc, inner_len, now);
		rx_track_peer(ip6->saddr.s6_addr, mrc);
		feedback_file(ip6->saddr.s6_addr, mrc, now);
		if (mrc->flags & MRC_F_CONTROL) {
			count(MRC_RX_CONTROL);	/* it carried feedback only */
			return XDP_DROP;
		}
		feedback_due(ip6->saddr.s6_addr, cfg, now);
	}

	/* Strip outer IPv6 + SRH; the Ethernet header moves up to the inner. */
	__builtin_memcpy(&eth_copy, eth, sizeof(eth_copy));
	if (bpf_xdp_adjust_head(ctx, outer_len))
		return rx_drop(MRC_RX_DROP_DECAP_FAIL);
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return rx_drop(MRC_RX_DROP_DECAP_FAIL);
	__builtin_memcpy(eth->h_dest, eth_copy.h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth_copy.h_source, ETH_ALEN);
	eth->h_proto = bpf_htons(inner_proto);

	count(MRC_RX_DECAP);
	count_add(MRC_RX_DECAP_BYTES, inner_len);
	return XDP_PASS;
}
