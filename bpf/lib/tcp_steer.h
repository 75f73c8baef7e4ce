/* SPDX-License-Identifier: GPL-2.0 */
/*
 * TCP retransmissions go to a path the peer heard lately.
 *
 * When a path fails, the segments sprayed into it before the datapath
 * takes it out are lost; TCP repairs them (RACK, SACK) about a round trip
 * later, and its retransmissions, sprayed like any packet, went into the
 * same hole a quarter of the time while it was still in use.  A lost
 * retransmission costs TCP another round, or an RTO when nothing was sent
 * after it (docs/design/tcp.md).  A retransmission is recognised without
 * any state of the socket: a segment that ends at or below the highest
 * sequence this flow has sent.  It keeps its spray turn's path if the
 * peer acknowledged that path about as lately as any (a black-holed path
 * is acknowledged no more, so it falls behind), else it goes on another.
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
#include "lib/parse.h"

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
	void *data_end = (void *)(long)skb->data_end;
	__u16 family;
	void *l3 = parse_ip(skb, &family);

	if (!l3)
		return 0;
	if (family == ETH_P_IPV6) {
		struct ipv6hdr *ip6 = l3;
		__u32 *ports = (void *)(ip6 + 1), *a = (void *)&ip6->saddr;

		/* the ports' word past the 40 bytes parse_ip checked */
		if ((void *)(ports + 1) > data_end || ip6->nexthdr != IPPROTO_TCP)
			return 0;
		*flow_key = a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7] ^ *ports;
		*l4 = ETH_HLEN + sizeof(*ip6);
		*l4_len = bpf_ntohs(ip6->payload_len);
		return 1;
	}
	struct iphdr *ip4 = l3;
	__u32 ihl, total, *ports;

	if (ip4->protocol != IPPROTO_TCP)
		return 0;
	ihl = ip4->ihl * 4;
	total = bpf_ntohs(ip4->tot_len);
	if (ihl < sizeof(*ip4) || total < ihl)
		return 0;
	ihl &= 0x3c;		/* for the verifier: ihl * 4 <= 60 */
	ports = l3 + ihl;
	if ((void *)(ports + 1) > data_end)
		return 0;
	*flow_key = ip4->saddr ^ ip4->daddr ^ *ports;
	*l4 = ETH_HLEN + ihl;
	*l4_len = total - ihl;
	return 1;
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
 * May a retransmission that the spray gave `given` go on path `id`
 * instead: a path of the packet's own set (up, and of the class of the
 * given one: a path may have been deleted, or be another class's reserve,
 * since it was heard), not down, and heard from lately (`fresh`)?
 */
static __always_inline int tcp_steer_usable(const struct mrc_peer *peer, struct mrc_peer_state *st,
					    struct mrc_row_state *rs, const struct mrc_path *given,
					    __u32 id, __u64 fresh)
{
	__u32 index = peer->template_id * MRC_MAX_PATHS + id;
	struct mrc_path *path;

	if (id >= peer->n_paths || id >= MRC_MAX_PATHS)
		return 0;
	path = mrc_paths.lookup(&index);
	if (!path || path->state != MRC_PATH_UP || path->tclass != given->tclass)
		return 0;
	return !row_path_live(rs, id)->down_ns && *peer_path_acked(st, id) >= fresh;
}

/*
 * A retransmission's path.  The spray's, if the peer has heard that path
 * lately: within two report intervals of the newest acknowledgement of
 * any path (peer_tx.heard_ns), the lag a live path's acknowledgement has
 * when the peer reports its paths a block at a time (lib/feedback.h).
 * Else a random other path that was heard lately, or else the one heard
 * most recently.  Random, not always the heard path: with one path of four
 * black-holed, all its retransmissions on the heard path made that path
 * carry 6-13% more than the others (tests/test_tcp_steer.py), a queue
 * that reorders the flow.  Two candidates at most: O(1) like the spray.
 */
static __always_inline void tcp_steer_pick(const struct mrc_peer *peer, const struct mrc_config *cfg,
					   struct path_choice *choice)
{
	struct mrc_peer_state *st = choice->st;
	struct mrc_row_state *rs = choice->rs;
	struct mrc_path *given;
	__u64 lag = 2 * 1000 * (__u64)cfg->fb_interval_us, fresh;
	__u32 id, n = peer->n_paths, index;

	if (choice->probe || !st)
		return;
	if (!st->acks.last_ns)
		return;		/* no feedback from this peer: nothing to go by */
	count(MRC_TX_TCP_RETRANS);
	if (st->tx.heard_ns <= lag || n < 2)
		return;
	fresh = st->tx.heard_ns - lag;
	if (*peer_path_acked(st, choice->path_id) >= fresh)
		return;
	given = mrc_paths.lookup(&choice->path_index);
	if (!given)
		return;
	id = (choice->path_id + 1 + bpf_get_prandom_u32() % (n - 1)) % n;
	if (!tcp_steer_usable(peer, st, rs, given, id, fresh)) {
		id = st->tx.heard_path;
		if (id == choice->path_id || !tcp_steer_usable(peer, st, rs, given, id, 0))
			return;
	}
	index = peer->template_id * MRC_MAX_PATHS + id;
	count(MRC_TX_RETRANS_STEERED);
	choice->path_id = id;
	choice->path_index = index;
	choice->live = row_path_live(rs, id);
}

#endif
