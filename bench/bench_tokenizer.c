/* Tokenizer benchmark, C side (driven by bench/bench_tokenizer.sh, which
 * runs HF's tokenizers on the same input in the same run).
 *
 *   bench_tokenizer DIR FILE [REPS]
 *
 * Prints one line: load ms (best of 5), encode MB/s single-threaded over the
 * whole file as one string (best of REPS), token count, decode MB/s, and
 * encode MB/s paragraph by paragraph (split at blank lines: prompt-sized
 * inputs, one call each). */
#include "core/alloc.h"
#include "core/clock.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenizer DIR FILE [REPS]\n");
        return 2;
    }
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    rewind(f);
    char *text = exo_malloc(n + 1);
    if (fread(text, 1, n, f) != n)
        return 1;
    fclose(f);

    exo_tokenizer *tok = NULL;
    exo_err err;
    double load = 1e9;
    for (int i = 0; i < 5; i++) {
        exo_tokenizer_free(tok);
        double t0 = exo_clock_seconds();
        if (exo_tokenizer_load(argv[1], &tok, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        double t = exo_clock_seconds() - t0;
        load = t < load ? t : load;
    }
    double enc = 1e9, dec = 1e9;
    size_t ntok = 0;
    for (int r = 0; r < reps; r++) {
        int32_t *ids;
        double t0 = exo_clock_seconds();
        if (exo_tokenizer_encode(tok, text, n, false, &ids, &ntok, &err))
            return 1;
        double t = exo_clock_seconds() - t0;
        enc = t < enc ? t : enc;
        t0 = exo_clock_seconds();
        char *s = exo_tokenizer_decode(tok, ids, ntok, false, NULL);
        t = exo_clock_seconds() - t0;
        dec = t < dec ? t : dec;
        exo_free(s);
        exo_free(ids);
    }
    double para = 1e9;
    for (int r = 0; r < reps; r++) {
        double t0 = exo_clock_seconds();
        for (const char *p = text, *end = text + n; p < end;) {
            const char *q = memmem(p, (size_t)(end - p), "\n\n", 2);
            q = q ? q + 2 : end;
            int32_t *ids;
            size_t k;
            if (exo_tokenizer_encode(tok, p, (size_t)(q - p), false, &ids, &k, &err))
                return 1;
            exo_free(ids);
            p = q;
        }
        double t = exo_clock_seconds() - t0;
        para = t < para ? t : para;
    }
    printf("load_ms %.1f encode_MBps %.2f tokens %zu decode_MBps %.1f para_MBps %.2f\n", load * 1e3,
           n / enc / 1e6, ntok, n / dec / 1e6, n / para / 1e6);
    exo_tokenizer_free(tok);
    exo_free(text);
    return 0;
}
