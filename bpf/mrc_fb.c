/* SPDX-License-Identifier: GPL-2.0 */
/*
 * FB, at TC ingress, after mrc_rx has decapsulated: when the packet's
 * sender is owed feedback (mrc_rx set fb_due: one-way traffic, nothing of
 * ours has carried feedback lately), clone the packet to our own egress
 * marked MRC_FB_MARK; mrc_tx turns the clone into a feedback-only packet
 * (lib/control.h).  The packet itself goes on up untouched.
 */
#include "lib/counters.h"
#include "lib/peer_state.h"
#include "lib/parse.h"

int mrc_fb(struct __sk_buff *skb)
{
	struct mrc_peer_key key = { .prefixlen = 128 };
	struct mrc_peer *peer;
	struct mrc_peer_state *st;
	__u32 mark;
	__u16 family;
	void *l3 = parse_ip(skb, &family);

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
