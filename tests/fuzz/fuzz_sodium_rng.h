/* A deterministic randombytes implementation for the link fuzz targets:
 * libsodium's key generation and nonces draw from a seeded splitmix64, so a
 * crash found by the fuzzer replays byte for byte. Install it with
 * randombytes_set_implementation(&fuzz_rng) before sodium_init(), and set
 * rng_state to reseed; fuzz_sodium_start() does both and fuzz_identity()
 * makes a fixed node key. Header-only: each target is one translation unit. */
#ifndef EXO_FUZZ_SODIUM_RNG_H
#define EXO_FUZZ_SODIUM_RNG_H

#include "net/identity.h"

#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static const char *rng_name(void) { return "fuzz"; }
static uint32_t rng_random(void) { return (uint32_t)rng_next(); }
static void rng_stir(void) {}

static void rng_buf(void *const buf, const size_t size)
{
    uint8_t *p = buf;
    for (size_t i = 0; i < size; i++)
        p[i] = (uint8_t)rng_next();
}

static int rng_close(void) { return 0; }

static randombytes_implementation fuzz_rng = {
    .implementation_name = rng_name,
    .random = rng_random,
    .stir = rng_stir,
    .uniform = NULL,
    .buf = rng_buf,
    .close = rng_close,
};

static void fuzz_sodium_start(void)
{
    randombytes_set_implementation(&fuzz_rng);
    if (sodium_init() < 0)
        abort();
}

/* The same key for the same seed byte, run after run. */
static void fuzz_identity(uint8_t seed_byte, exo_identity *id)
{
    uint8_t seed[32] = {seed_byte};
    crypto_sign_seed_keypair(id->pk, id->sk, seed);
    exo_identity_node_id_of(id->pk, id->node_id);
}

#endif
