/* The compute limit of the quantized GEMV, as exo_membw is its memory
 * limit: the rate of the integer dot products it is built on (AVX-512
 * VNNI vpdpbusd, 64 u8 x s8 products an instruction), measured on every
 * thread of a pool at once. A batched GEMV reads each weight once for
 * all its rows of X, so past a few rows it is bounded by these products
 * rather than by memory; its benchmark prints its ratio to this. It is the
 * vector units' limit: where AMX runs batched rows (Intel), the tile units
 * can go past it. */
#ifndef EXO_ENGINE_CPU_DOTPEAK_H
#define EXO_ENGINE_CPU_DOTPEAK_H

#include "core/threadpool.h"

/* u8 x s8 products a second over all of the pool's threads (the best of
 * three rounds of a few ms), or 0 where the CPU has no AVX-512 VNNI. */
double exo_dot_peak(exo_pool *pool);

/* Internal: `iters` rounds of 12 independent vpdpbusd; the value keeps
 * them from being optimised away. */
unsigned long long exo_dot_peak_avx512(long iters, int seed);

#endif
