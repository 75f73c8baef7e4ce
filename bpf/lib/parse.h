/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Ethernet -> IP: the one parse of a TC packet's network header, for TX's
 * classifier, TCP steering, the feedback clone and mrc_fb.  (XDP's RX
 * parses outer IPv6 + SRH itself: mrc_rx.c.)
 */
#ifndef MRC_LIB_PARSE_H
#define MRC_LIB_PARSE_H

/*
 * The IP header after the Ethernet header, its fixed part (40 bytes IPv6,
 * 20 IPv4) checked to be in the packet; *family is ETH_P_IPV6 or
 * ETH_P_IP.  NULL for any other EtherType, or a runt.
 */
static __always_inline void *parse_ip(struct __sk_buff *skb, __u16 *family)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return NULL;
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		if ((void *)(eth + 1) + sizeof(struct ipv6hdr) > data_end)
			return NULL;
		*family = ETH_P_IPV6;
		return eth + 1;
	}
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		if ((void *)(eth + 1) + sizeof(struct iphdr) > data_end)
			return NULL;
		*family = ETH_P_IP;
		return eth + 1;
	}
	return NULL;
}

#endif
