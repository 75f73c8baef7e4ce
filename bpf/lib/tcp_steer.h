/* SPDX-License-Identifier: GPL-2.0 */
/*
 * TCP retransmissions go to the path the peer heard most recently.
 *
 * When a path fails, the segments sprayed into it before the datapath
 * takes it out are lost; TCP repairs them (RACK, SACK) about a round trip
 * later, and its retransmissions, sprayed like any packet, went into the
 * same hole a quarter of the time while it was still in use.  A lost
 * retransmission costs TCP another round, or an RTO when nothing was sent
 * after it (docs/design/tcp.md).  A retransmission is recognised without
 * any state of the socket: a segment that ends at or below the highest
 * sequence this flow has sent.  It then leaves on the path whose latest
 * acknowledgement is the newest: a path in a black hole is acknowledged
 * no more, so it is never the one chosen.
 *
 * tx_flows is direct-mapped by a hash of the flow's addresses and ports:
 * O(1), no lock, and a collision only makes one segment look new (sprayed
 * as usual).  Not by the skb's hash: for a local TCP socket that is the
 * socket's txhash, which the kernel draws anew on every RTO (and PLB
 * rehash), so the retransmission an RTO sends, the one that most needs a
 * live path, looked new and was sprayed.
 */
#ifndef MRC_LIB_TCP_STEER_H
#define MRC_LIB_TCP_STEER_H

#include "lib/maps.h"
#include "lib/counters.h"
#include "lib/compiler.h"

#define TCP_FLAG_FIN	0x01
#define TCP_FLAG_SYN	0x02

/* The fixed TCP header, as far as it is read here. */
struct tcp_steer_hdr {
	__be16	source;
	__be16	dest;
	__be32	seq;
	__be32	ack_seq;
	__u8	doff_res;	/* data offset in the high 4 bits */
	__u8	flags;
	__be16	window;
	__sum16	check;
	__be16	urg_ptr;
};

/*
 * Is this packet a TCP segment that carries nothing new (a retransmission,
 * or a tail loss probe resending the last segment)?  Records the highest
 * sequence sent otherwise.  `l4` is the TCP header's offset in the frame,
 * `flow_key` the flow's addresses and ports folded (tcp_steer_locate).
 */
static __always_inline int tcp_steer_is_retrans(struct __sk_buff *skb, __u32 l4, __u32 l4_len,
						__u32 flow_key)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct tcp_steer_hdr *tcp;
	struct mrc_tx_flow *flow;
	__u32 slot, seq, end, doff, payload;
	__u8 flags;

	barrier_var(l4);
	l4 &= 0xff;			/* Ethernet + IPv4 with options <= 74 */
	tcp = data + l4;
	if ((void *)(tcp + 1) > data_end)
		return 0;
	doff = (tcp->doff_res >> 4) * 4;
	if (doff < sizeof(*tcp) || l4_len < doff)
		return 0;
	payload = l4_len - doff;
	flags = tcp->flags;
	if (!payload && !(flags & (TCP_FLAG_SYN | TCP_FLAG_FIN)))
		return 0;		/* a pure ACK: takes no sequence space */
	seq = bpf_ntohl(tcp->seq);
	end = seq + payload + !!(flags & TCP_FLAG_SYN) + !!(flags & TCP_FLAG_FIN);

	/* mixed, so that flows differing in a few bits spread over slots */
	slot = ((flow_key ^ (flow_key >> 16)) * 0x85ebca6bU) >> 16;
	slot &= MRC_TX_FLOWS - 1;
	flow = mrc_tx_flows.lookup(&slot);
	if (!flow)
		return 0;
	if (flow->key != flow_key || (flags & TCP_FLAG_SYN)) {
		flow->key = flow_key;
		flow->snd_nxt = end;
		return 0;
	}
	if ((__s32)(end - flow->snd_nxt) > 0) {
		flow->snd_nxt = end;
		return 0;
	}
	return 1;
}

/*
 * The inner packet's TCP header offset, the TCP length (header and
 * payload) and the flow's addresses and ports folded into a word, from the
 * inner IP header; 0 when it is not TCP (or has IPv6 extension headers:
 * then it is sprayed as usual).
 */
static __always_inline int tcp_steer_locate(struct __sk_buff *skb, __u32 *l4, __u32 *l4_len,
					    __u32 *flow_key)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return 0;
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		__u32 *ports = (void *)(ip6 + 1), *a = (void *)&ip6->saddr;

		/* the ports' word and both addresses: 40 + 4 bytes past eth */
		if ((void *)(ports + 1) > data_end || ip6->nexthdr != IPPROTO_TCP)
			return 0;
		*flow_key = a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7] ^ *ports;
		*l4 = sizeof(*eth) + sizeof(*ip6);
		*l4_len = bpf_ntohs(ip6->payload_len);
		return 1;
	}
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip4 = (void *)(eth + 1);
		__u32 ihl, total;

		if ((void *)(ip4 + 1) > data_end || ip4->protocol != IPPROTO_TCP)
			return 0;
		ihl = ip4->ihl * 4;
		total = bpf_ntohs(ip4->tot_len);
		__u32 *ports;

		if (ihl < sizeof(*ip4) || total < ihl)
			return 0;
		ihl &= 0x3c;		/* for the verifier: ihl * 4 <= 60 */
		ports = (void *)ip4 + ihl;
		if ((void *)(ports + 1) > data_end)
			return 0;
		*flow_key = ip4->saddr ^ ip4->daddr ^ *ports;
		*l4 = sizeof(*eth) + ihl;
		*l4_len = total - ihl;
		return 1;
	}
	return 0;
}

/*
 * After a packet's path was chosen: if the peer's newest acknowledgement
 * of that path is the newest TX has seen of any path, remember the path.
 * Spraying visits every path every few packets, so this follows the path
 * heard most recently at no more cost than a compare; a failed path's
 * acknowledgements stop, and any live path's next one takes its place.
 */
static __always_inline void tcp_steer_heard(struct mrc_peer_state *st, __u16 path_id)
{
	struct mrc_peer_tx *ptx = &st->tx;
	__u64 heard;

	heard = *peer_path_acked(st, path_id);
	if (heard > ptx->heard_ns || path_id == ptx->heard_path) {
		ptx->heard_ns = heard;
		ptx->heard_path = path_id;
	}
}

/*
 * A retransmission's path: the one heard most recently, if it is up and
 * heard later than the path the spray gave it.
 */
static __always_inline void tcp_steer_pick(const struct mrc_peer *peer, struct path_choice *choice)
{
	__u32 row = peer->template_id, index;
	struct mrc_peer_acks *acks;
	struct mrc_peer_tx *ptx;
	struct mrc_path_live *live;
	struct mrc_path *path, *given;
	__u32 id;

	if (choice->probe)
		return;
	if (!choice->st)
		return;
	acks = &choice->st->acks;
	ptx = &choice->st->tx;
	if (!acks->last_ns)
		return;		/* no feedback from this peer: nothing to go by */
	count(MRC_TX_TCP_RETRANS);
	id = ptx->heard_path;
	if (id >= peer->n_paths || id >= MRC_MAX_PATHS || id == choice->path_id ||
	    ptx->heard_ns <= *peer_path_acked(choice->st, choice->path_id))
		return;
	index = row * MRC_MAX_PATHS + id;
	/* still a path of the packet's own set: up, and of the class of the
	 * path the spray gave it (a path may have been deleted, or be another
	 * class's reserve, since it was heard) */
	path = mrc_paths.lookup(&index);
	given = mrc_paths.lookup(&choice->path_index);
	if (!path || !given || path->state != MRC_PATH_UP || path->tclass != given->tclass)
		return;
	live = peer_path_live(choice->st, id);
	if (live->down_ns)
		return;
	count(MRC_TX_RETRANS_STEERED);
	choice->path_id = id;
	choice->path_index = index;
	choice->live = live;
}

#endif
