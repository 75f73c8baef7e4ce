/* SPDX-License-Identifier: GPL-2.0 */
/* Per-CPU counters: no atomics and no shared cache lines on the fast path. */
#ifndef MRC_LIB_COUNTERS_H
#define MRC_LIB_COUNTERS_H

#include "lib/maps.h"

static __always_inline void count_add(__u32 counter, __u64 n)
{
	__u64 *value = mrc_counters.lookup(&counter);

	if (value)
		*value += n;
}

static __always_inline void count(__u32 counter)
{
	count_add(counter, 1);
}

#endif
