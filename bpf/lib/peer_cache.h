/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The peer of a destination, by a hash lookup of the address before the
 * LPM trie (struct mrc_peer_cached): the trie's walk grows with the
 * prefixes it holds (TX per packet +16-19% from 1 to 131,071 peers in the
 * address plan), a hash lookup does not.  An entry holds the trie's
 * answer, "no peer" included, and the generation of peers it was read
 * under (peers_gen, bumped by the control plane after each write to
 * peers): the generation is read before the trie, so an answer read
 * under the old trie never passes for the new one.  Used by mrc_tx only.
 */
#ifndef MRC_LIB_PEER_CACHE_H
#define MRC_LIB_PEER_CACHE_H

#include "lib/maps.h"

/* A hit is copied to the per-CPU peer_buf (an LRU element may be reused
 * by another CPU's update while this packet still reads it; the trie's
 * are freed after RCU).  TC egress runs with bottom halves off, so no
 * other packet of this CPU uses peer_buf meanwhile. */
static __always_inline struct mrc_peer *peer_lookup(struct mrc_peer_key *key)
{
	struct mrc_peer_cached *hit, *buf;
	struct mrc_peer *peer;
	__u32 zero = 0, gen, *genp = mrc_peers_gen.lookup(&zero);
	struct mrc_sid *addr = (struct mrc_sid *)key->addr;

#ifdef MRC_NO_PEER_CACHE	/* bench cost's comparison: the trie alone */
	return mrc_peers.lookup(key);
#endif
	buf = mrc_peer_buf.lookup(&zero);
	if (!genp || !buf)
		return NULL;
	gen = *(volatile __u32 *)genp;
	hit = mrc_peer_cache.lookup(addr);
	if (hit && hit->gen == gen) {
		if (!hit->found)
			return NULL;
		__builtin_memcpy(&buf->peer, &hit->peer, sizeof(buf->peer));
		return &buf->peer;
	}
	peer = mrc_peers.lookup(key);
	buf->gen = gen;
	buf->found = !!peer;
	if (peer)
		__builtin_memcpy(&buf->peer, peer, sizeof(buf->peer));
	else
		__builtin_memset(&buf->peer, 0, sizeof(buf->peer));
	mrc_peer_cache.update(addr, buf);
	/* always the copy: one kind of pointer for the verifier to follow
	 * (two, the trie's and the copy's, doubled the states it explores) */
	return peer ? &buf->peer : NULL;
}

#endif
