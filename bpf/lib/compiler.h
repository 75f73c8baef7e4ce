/* SPDX-License-Identifier: GPL-2.0 */
/* Small helpers for writing code the verifier accepts. */
#ifndef MRC_LIB_COMPILER_H
#define MRC_LIB_COMPILER_H

/* Hides a value from clang's range analysis, so a bound check or mask
 * written after it stays on the register that indexes (clang would
 * otherwise fold it into an earlier check the verifier cannot see). */
#define barrier_var(var)	asm volatile("" : "+r"(var))

#ifndef __noinline
#define __noinline	__attribute__((__noinline__))
#endif

/* BPF runs little-endian here, as the host does. */
#define mrc_htonll(x)	__builtin_bswap64(x)
#define mrc_ntohll(x)	__builtin_bswap64(x)

#endif
