/* Differential checker for the C tokenizer (built and run by
 * tests/integration/test_tokenizer.sh against the build's libexo.a).
 *
 *   check oracle DIR CASES.jsonl     cases from tests/tokenizer/oracle.js
 *   check vectors DIR NAME.inp NAME.out   llama.cpp's vocab test vectors
 *   check load DIR [N]               prints the best load time of N loads
 *
 * For every oracle case it compares encode without and with special tokens,
 * decode with and without skip_special, and checks that the streaming
 * detokenizer's pieces are valid UTF-8 and concatenate to the full decode.
 * Prints "NAME: N cases, M mismatches" and exits 1 on any mismatch. */
#include "core/alloc.h"
#include "core/clock.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int shown;

static void show(const char *what, size_t line, const char *text, size_t len)
{
    if (shown++ >= 12)
        return;
    fprintf(stderr, "  mismatch (%s) case %zu: \"%.*s\"\n", what, line, (int)(len > 120 ? 120 : len), text);
}

static bool ids_equal(const int32_t *a, size_t n, json_t *arr)
{
    if (json_array_size(arr) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(arr, i)) != a[i])
            return false;
    return true;
}

static void print_ids(const char *label, const int32_t *a, size_t n, json_t *arr)
{
    if (shown > 12)
        return;
    fprintf(stderr, "    %s got:", label);
    for (size_t i = 0; i < n && i < 40; i++)
        fprintf(stderr, " %d", a[i]);
    fprintf(stderr, "\n    %s want:", label);
    for (size_t i = 0; i < json_array_size(arr) && i < 40; i++)
        fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(arr, i)));
    fprintf(stderr, "\n");
}

static bool valid_utf8(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n); /* jansson validates UTF-8 */
    json_decref(j);
    return j != NULL;
}

static int unhex(const char *h, char *out)
{
    size_t n = strlen(h) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        out[i] = (char)v;
    }
    return (int)n;
}

static int run_oracle(const char *dir, const char *cases)
{
    exo_tokenizer *tok;
    exo_err err;
    if (exo_tokenizer_load(dir, &tok, &err)) {
        fprintf(stderr, "load %s: %s\n", dir, err.msg);
        return 1;
    }
    FILE *f = fopen(cases, "r");
    if (!f) {
        perror(cases);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0, nline = 0, bad = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) > 0) {
        nline++;
        json_error_t je;
        json_t *c = json_loadb(line, (size_t)got, JSON_ALLOW_NUL, &je);
        if (!c) {
            fprintf(stderr, "%s:%zu: %s\n", cases, nline, je.text);
            bad++;
            continue;
        }
        const char *text;
        size_t len;
        char hexbuf[256];
        json_t *t = json_object_get(c, "t");
        if (t) {
            text = json_string_value(t);
            len  = json_string_length(t);
        } else {
            len  = (size_t)unhex(json_string_value(json_object_get(c, "hex")), hexbuf);
            text = hexbuf;
        }
        bool ok = true;
        int32_t *ids, *sids;
        size_t n, sn;
        if (exo_tokenizer_encode(tok, text, len, false, &ids, &n, &err) ||
            exo_tokenizer_encode(tok, text, len, true, &sids, &sn, &err)) {
            fprintf(stderr, "encode failed: %s\n", err.msg);
            return 1;
        }
        if (!ids_equal(ids, n, json_object_get(c, "ids"))) {
            ok = false;
            show("ids", nline, text, len);
            print_ids("ids", ids, n, json_object_get(c, "ids"));
        } else if (!ids_equal(sids, sn, json_object_get(c, "sids"))) {
            ok = false;
            show("sids", nline, text, len);
            print_ids("sids", sids, sn, json_object_get(c, "sids"));
        }
        /* decode the oracle's ids, so decode is tested even if encode differs */
        json_t *jids = json_object_get(c, "ids"), *jsids = json_object_get(c, "sids");
        size_t on = json_array_size(jids), osn = json_array_size(jsids);
        int32_t *oids = exo_malloc((on + 1) * sizeof *oids), *osids = exo_malloc((osn + 1) * sizeof *osids);
        for (size_t i = 0; i < on; i++)
            oids[i] = (int32_t)json_integer_value(json_array_get(jids, i));
        for (size_t i = 0; i < osn; i++)
            osids[i] = (int32_t)json_integer_value(json_array_get(jsids, i));
        size_t dl, sdl;
        char *dec = exo_tokenizer_decode(tok, oids, on, false, &dl);
        char *sdec = exo_tokenizer_decode(tok, osids, osn, true, &sdl);
        json_t *wd = json_object_get(c, "dec"), *wsd = json_object_get(c, "sdec");
        if (dl != json_string_length(wd) || memcmp(dec, json_string_value(wd), dl)) {
            ok = false;
            show("decode", nline, text, len);
            if (shown <= 12)
                fprintf(stderr, "    got \"%.*s\"\n    want \"%s\"\n", (int)(dl > 200 ? 200 : dl), dec,
                        json_string_value(wd));
        } else if (sdl != json_string_length(wsd) || memcmp(sdec, json_string_value(wsd), sdl)) {
            ok = false;
            show("decode skip_special", nline, text, len);
            if (shown <= 12)
                fprintf(stderr, "    got \"%.*s\"\n    want \"%s\"\n", (int)(sdl > 200 ? 200 : sdl), sdec,
                        json_string_value(wsd));
        }
        /* streaming: pieces are valid UTF-8 and add up to the decode */
        for (int skip = 0; skip < 2 && ok; skip++) {
            const int32_t *sv = skip ? osids : oids;
            size_t sc = skip ? osn : on;
            exo_detok_stream *ds = exo_detok_stream_new(tok, skip);
            char *acc = exo_malloc(1);
            size_t al = 0;
            bool pieces_ok = true;
            for (size_t i = 0; i <= sc; i++) {
                size_t pl;
                const char *p = i < sc ? exo_detok_stream_push(ds, sv[i], &pl) : exo_detok_stream_flush(ds, &pl);
                if (!valid_utf8(p, pl))
                    pieces_ok = false;
                acc = exo_realloc(acc, al + pl + 1);
                memcpy(acc + al, p, pl);
                al += pl;
            }
            exo_detok_stream_free(ds);
            const char *want = skip ? sdec : dec;
            size_t wl = skip ? sdl : dl;
            if (!pieces_ok || al != wl || memcmp(acc, want, al)) {
                ok = false;
                show(pieces_ok ? "stream" : "stream utf8", nline, text, len);
                if (shown <= 12)
                    fprintf(stderr, "    got \"%.*s\"\n", (int)(al > 200 ? 200 : al), acc);
            }
            exo_free(acc);
        }
        bad += !ok;
        exo_free(ids);
        exo_free(sids);
        exo_free(oids);
        exo_free(osids);
        exo_free(dec);
        exo_free(sdec);
        json_decref(c);
    }
    free(line);
    fclose(f);
    exo_tokenizer_free(tok);
    printf("%s: %zu cases, %zu mismatches\n", dir, nline, bad);
    return bad ? 1 : 0;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *b = exo_malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    b[*len] = 0;
    fclose(f);
    return b;
}

static int run_vectors(const char *dir, const char *inp, const char *outp)
{
    exo_tokenizer *tok;
    exo_err err;
    if (exo_tokenizer_load(dir, &tok, &err)) {
        fprintf(stderr, "load %s: %s\n", dir, err.msg);
        return 1;
    }
    size_t il, ol;
    char *in = slurp(inp, &il), *out = slurp(outp, &ol);
    if (!in || !out) {
        fprintf(stderr, "cannot read %s / %s\n", inp, outp);
        return 1;
    }
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t seplen = strlen(sep), ncase = 0, bad = 0;
    char *p = in, *o = out;
    for (;;) {
        char *e = strstr(p, sep);
        if (!e)
            break;
        char *ol_end = strchr(o, '\n');
        if (!ol_end)
            break;
        *ol_end = 0;
        int32_t *ids;
        size_t n;
        exo_tokenizer_encode(tok, p, (size_t)(e - p), false, &ids, &n, &err);
        char got[8192];
        size_t gl = 0;
        for (size_t i = 0; i < n && gl + 16 < sizeof got; i++)
            gl += (size_t)snprintf(got + gl, sizeof got - gl, " %d", ids[i]);
        got[gl] = 0;
        ncase++;
        if (strcmp(got, o)) {
            bad++;
            fprintf(stderr, "  vector %zu \"%.*s\":\n    got %s\n    want %s\n", ncase, (int)(e - p), p, got, o);
        }
        exo_free(ids);
        p = e + seplen;
        o = ol_end + 1;
    }
    exo_free(in);
    exo_free(out);
    exo_tokenizer_free(tok);
    printf("%s: %zu vectors, %zu mismatches\n", inp, ncase, bad);
    return bad || !ncase ? 1 : 0;
}

static int run_load(const char *dir, int reps)
{
    double best = 1e9;
    for (int i = 0; i < reps; i++) {
        exo_tokenizer *tok;
        exo_err err;
        double t0 = exo_clock_seconds();
        if (exo_tokenizer_load(dir, &tok, &err)) {
            fprintf(stderr, "load %s: %s\n", dir, err.msg);
            return 1;
        }
        double t = exo_clock_seconds() - t0;
        if (t < best)
            best = t;
        exo_tokenizer_free(tok);
    }
    printf("%.1f\n", best * 1e3);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 4 && !strcmp(argv[1], "oracle"))
        return run_oracle(argv[2], argv[3]);
    if (argc >= 5 && !strcmp(argv[1], "vectors"))
        return run_vectors(argv[2], argv[3], argv[4]);
    if (argc >= 3 && !strcmp(argv[1], "load"))
        return run_load(argv[2], argc >= 4 ? atoi(argv[3]) : 5);
    fprintf(stderr, "usage: check oracle DIR CASES | vectors DIR INP OUT | load DIR [N]\n");
    return 2;
}
