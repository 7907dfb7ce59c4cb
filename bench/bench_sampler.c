/* Microbenchmark of the sampler on a 128k vocabulary (Llama 3's), the
 * host's share of every generated token: greedy, temperature 1, top-p 0.9
 * and top-k 40 + top-p 0.95, with logits shaped like a model's (a normal
 * spread of std 3 and a few tens of likely tokens on top), and top-k 40
 * and top-p 0.9 over a flat vocabulary (std 0.3: a random-weights
 * model's logits, where no short head holds the mass). The peer,
 * measured in the same run, is what top-p used to cost: sorting the whole
 * vocabulary with qsort. Also prints the time to copy the logits once, the
 * floor of any pass over them.
 *
 * Usage: bench_sampler [rounds=200] */
#include "core/clock.h"
#include "engine/sampler.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { VOCAB = 128256 };

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static double next_unit(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1.0p-53;
}

static const float *cmp_logits;
static int by_logit_desc(const void *a, const void *b)
{
    float la = cmp_logits[*(const int32_t *)a], lb = cmp_logits[*(const int32_t *)b];
    return la != lb ? (la > lb ? -1 : 1) : *(const int32_t *)a - *(const int32_t *)b;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    float *logits = malloc(sizeof(float) * VOCAB), *work = malloc(sizeof(float) * VOCAB);
    float *flat = malloc(sizeof(float) * VOCAB);
    int32_t *ids = malloc(sizeof(int32_t) * VOCAB);
    for (int i = 0; i < VOCAB; i++) {
        double u = 0;
        for (int j = 0; j < 12; j++)
            u += next_unit();
        logits[i] = (float)((u - 6) * 3);
        flat[i] = logits[i] * 0.1f;
    }
    for (int i = 0; i < 50; i++)
        logits[(int)(next_unit() * VOCAB)] = 18.0f - 0.2f * (float)i;
    double t0 = exo_clock_seconds();
    for (int r = 0; r < rounds; r++)
        memcpy(work, logits, sizeof(float) * VOCAB);
    double copy_us = (exo_clock_seconds() - t0) / rounds * 1e6;
    printf("copy of the logits        %8.1f us\n", copy_us);
    static const struct { const char *name; float temperature, top_p; int top_k; bool flat; } cases[] = {
        {"greedy", 0, 1, 0, false}, {"temperature 1", 1, 1, 0, false}, {"top-p 0.9", 1, 0.9f, 0, false},
        {"top-k 40, top-p 0.95", 0.7f, 0.95f, 40, false}, {"top-k 40, flat", 0.7f, 1, 40, true},
        {"top-p 0.9, flat", 1, 0.9f, 0, true}};
    double sort_us = 0;
    {
        int n = rounds / 10 > 0 ? rounds / 10 : 1;
        t0 = exo_clock_seconds();
        for (int r = 0; r < n; r++) {
            for (int i = 0; i < VOCAB; i++)
                ids[i] = i;
            cmp_logits = logits;
            qsort(ids, VOCAB, sizeof *ids, by_logit_desc);
        }
        sort_us = (exo_clock_seconds() - t0) / n * 1e6;
        printf("peer: qsort of all logits %8.1f us\n", sort_us);
    }
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        exo_sampler_params p = exo_sampler_defaults();
        p.temperature = cases[c].temperature;
        p.top_p = cases[c].top_p;
        p.top_k = cases[c].top_k;
        exo_sampler *s = exo_sampler_create(&p, VOCAB);
        exo_sample out;
        t0 = exo_clock_seconds();
        for (int r = 0; r < rounds; r++) {
            memcpy(work, cases[c].flat ? flat : logits, sizeof(float) * VOCAB);
            exo_sampler_sample(s, work, NULL, 0, &out);
        }
        double us = (exo_clock_seconds() - t0) / rounds * 1e6;
        printf("%-25s %8.1f us a token (%.1fx a copy, %.3fx the full sort)\n", cases[c].name, us, us / copy_us,
               us / sort_us);
        exo_sampler_free(s);
    }
    free(logits);
    free(flat);
    free(work);
    free(ids);
    return 0;
}
