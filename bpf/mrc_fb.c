/* SPDX-License-Identifier: GPL-2.0 */
/*
 * FB, at TC ingress, after mrc_rx has decapsulated: when the packet's
 * sender is owed feedback (mrc_rx set fb_due: one-way traffic, nothing of
 * ours has carried feedback lately), clone the packet to our own egress
 * marked MRC_FB_MARK; mrc_tx turns the clone into a feedback-only packet
 * (lib/control.h).  The packet itself goes on up untouched.
 *
 * It also takes the peer's control packets (feedback-only packets and
 * probe copies) that XDP never saw: they are clones bpf_clone_redirect
 * made, the kernel marks such an skb redirected, and generic XDP passes
 * a redirected skb by without running the program (netif_receive_generic_xdp:
 * "reinjected packets ... should not get XDP generic processing"); a veth
 * carries the mark to its peer.  Between two hosts on one veth pair with
 * generic XDP (attach's default on veth) every control packet reached the
 * kernel instead (no route to our SID): its acknowledgements were lost, so
 * live paths went down, and no probe of a down path was ever answered.
 * Here such a packet is checked as mrc_rx would (rx_check), filed
 * (rx_file) and dropped.  Data packets XDP did not see stay the kernel's.
 */
#include "lib/counters.h"
#include "lib/peer_state.h"
#include "lib/parse.h"
#include "lib/trim.h"
#include "lib/port_tell.h"

/* Bytes of a control packet pulled into the linear area to check it: its
 * headers (outer IPv6 + SRH of up to MRC_MAX_SEGMENTS + TLV, inner header). */
#define FB_CONTROL_PULL		512

/*
 * A packet to our SID with a Routing or Destination Options header: if
 * valid and a control packet, filed and dropped (TC_ACT_SHOT); an invalid
 * one is dropped as mrc_rx drops it; anything else goes on (-1).
 */
static __always_inline int fb_control(struct __sk_buff *skb, const struct mrc_config *cfg)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6;
	struct mrc_tlv *mrc = NULL;
	struct mrc_rx_peer *sender;
	struct rx_ext ext = {};
	__u32 outer_len = 0, inner_len = 0, reason;
	__u16 inner_proto = 0;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IPV6))
		return -1;
	ip6 = (void *)(eth + 1);
	if ((void *)(ip6 + 1) > data_end)
		return -1;
	if (!addr_equal(ip6->daddr.s6_addr, cfg->sid) ||
	    (ip6->nexthdr != IPPROTO_ROUTING && ip6->nexthdr != IPPROTO_DSTOPTS))
		return -1;
	/* a control packet is headers only: linear whole, or not one */
	if (skb->len > FB_CONTROL_PULL)
		return -1;
	if ((long)skb->data_end - (long)skb->data < skb->len) {
		if (bpf_skb_pull_data(skb, skb->len))
			return -1;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		eth = data;
		if ((void *)(eth + 1) > data_end)
			return -1;
		ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > data_end)
			return -1;
	}
	reason = rx_check(ip6, data_end, &ext, &mrc, &outer_len, &inner_len, &inner_proto);
	if (reason) {
		count(MRC_RX_SEEN);
		count(reason);
		return TC_ACT_SHOT;
	}
	if (!mrc || !(mrc->flags & MRC_F_CONTROL))
		return -1;
	count(MRC_RX_SEEN);
	rx_file(ip6, mrc, inner_len, bpf_ktime_get_ns(), &sender);
	count(MRC_RX_CONTROL);
	count(MRC_RX_CONTROL_TC);
	return TC_ACT_SHOT;
}

int mrc_fb(struct __sk_buff *skb)
{
	struct mrc_peer_key key = { .prefixlen = 128 };
	struct mrc_peer *peer;
	struct mrc_peer_state *st;
	struct mrc_config *cfg;
	__u32 mark, zero = 0;
	__u16 family;
	void *l3;
	int rc;

	cfg = mrc_config.lookup(&zero);
	if (!cfg)
		return TC_ACT_OK;
	rc = trim_fb(skb);
	if (rc >= 0)
		return rc;
	rc = fb_control(skb, cfg);
	if (rc >= 0)
		return rc;
	/* a GSO super-packet cannot be cut to its headers (lib/control.h):
	 * the feedback stays due, for the next packet */
	if (skb->gso_size)
		return TC_ACT_OK;

	l3 = parse_ip(skb, &family);
	if (!l3)
		return TC_ACT_OK;
	if (family == ETH_P_IPV6) {
		struct ipv6hdr *ip6 = l3;

		__builtin_memcpy(key.addr, ip6->saddr.s6_addr, 16);
	} else {
		struct iphdr *ip4 = l3;

		key.addr[10] = 0xff;
		key.addr[11] = 0xff;
		__builtin_memcpy(&key.addr[12], &ip4->saddr, 4);
	}
	peer = mrc_peers.lookup(&key);
	if (!peer)
		return TC_ACT_OK;
	/* our port status to every peer at once, if it changed */
	port_tell(skb, cfg, peer, &key, family == ETH_P_IP);
	st = peer_state_find(peer->peer_id);
	if (!st || !__sync_bool_compare_and_swap(&st->fb_due, 1, 0))
		return TC_ACT_OK;
	mark = skb->mark;
	skb->mark = MRC_FB_MARK;
	if (bpf_clone_redirect(skb, skb->ifindex, 0) == 0)
		count(MRC_FB_CLONE);
	skb->mark = mark;
	return TC_ACT_OK;
}
