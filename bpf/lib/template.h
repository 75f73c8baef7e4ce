/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Path templates: a peer behind a destination leaf shares the paths of
 * its template (the same spines, planes, weights, classes) and only its
 * last hop is its own.  The path to send on is the template's, with that
 * last hop (segments[0], the last segment to visit, and peer_sid, which
 * is the same SID) replaced by the peer's, in a per-CPU copy: one 144-byte
 * copy per packet of a template's peer, nothing for a peer with its own
 * paths.
 */
#ifndef MRC_LIB_TEMPLATE_H
#define MRC_LIB_TEMPLATE_H

#include "lib/maps.h"

static __always_inline struct mrc_path *template_path(const struct mrc_peer *peer,
						       struct mrc_path *path)
{
	__u32 zero = 0;
	struct mrc_path *mine;

	if (!(peer->flags & MRC_PEER_F_LAST_HOP))
		return path;
	mine = mrc_tx_path.lookup(&zero);
	if (!mine)
		return NULL;
	__builtin_memcpy(mine, path, sizeof(*mine));
	__builtin_memcpy(mine->segments[0].addr, peer->sid.addr, 16);
	__builtin_memcpy(mine->peer_sid.addr, peer->sid.addr, 16);
	return mine;
}

#endif
