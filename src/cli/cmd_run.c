/* `exo run MODEL_DIR (--prompt TEXT | --chat TEXT | --tokens 1,2,3) [options]`:
 * generate from a local model and stream the text to stdout as it comes.
 * --prompt is encoded with the model's tokenizer (with its BOS/special
 * tokens), --chat goes through the model's chat template first, --tokens
 * takes ids. With --print-ids, or when the model has no tokenizer, the
 * generated ids are printed instead of text. Timing goes to stderr with
 * --stats. */
#include "cli/args.h"
#include "core/alloc.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int exo_cmd_run(int argc, char **argv);

typedef struct run_out {
    exo_detok_stream *ds;
    bool print_ids;
    int n;
    int logprobs;
    const exo_tokenizer *tok;
} run_out;

static int on_token(void *ctx, const exo_sample *s)
{
    run_out *o = ctx;
    if (o->print_ids || !o->ds) {
        printf(o->n++ ? " %d" : "%d", s->id);
    } else {
        size_t len;
        const char *piece = exo_detok_stream_push(o->ds, s->id, &len);
        fwrite(piece, 1, len, stdout);
    }
    if (o->logprobs) {
        fprintf(stderr, "[token %d logprob %.5f top:", s->id, s->logprob);
        for (int i = 0; i < s->n_top; i++)
            fprintf(stderr, " %d:%.5f", s->top_ids[i], s->top_logprobs[i]);
        fprintf(stderr, "]\n");
    }
    fflush(stdout);
    return 0;
}

static bool has_file(const char *dir, const char *name)
{
    char p[4096];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: exo run MODEL_DIR (--prompt TEXT | --chat TEXT | --tokens 1,2,3)\n"
            "  [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P]\n"
            "  [--repetition-penalty R] [--repetition-context-size N] [--presence-penalty P]\n"
            "  [--frequency-penalty P] [--seed S] [--logprobs N] [--threads N] [--ctx N]\n"
            "  [--system TEXT] [--enable-thinking true|false] [--ignore-eos] [--print-ids] [--stats]\n");
}

int exo_cmd_run(int argc, char **argv)
{
    const char *dir = NULL, *prompt = NULL, *chat = NULL, *toks = NULL, *system = NULL, *v;
    const char *thinking = NULL;
    long max_tokens = 256, threads = 0, ctx = 0, lp = 0;
    bool print_ids = false, stats_flag = false, ignore_eos = false;
    exo_sampler_params sp = exo_sampler_defaults();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        double d;
        long l;
#define VAL() (v = exo_arg_value("run", argc, argv, &i))
#define FLT(flag, lo, hi, dst) \
    else if (!strcmp(a, flag)) { if (!VAL() || exo_arg_float("run", flag, v, lo, hi, &d)) return 2; dst = (float)d; }
#define INT(flag, lo, hi, dst) \
    else if (!strcmp(a, flag)) { if (!VAL() || exo_arg_int("run", flag, v, lo, hi, &l)) return 2; dst = l; }
        if (!strcmp(a, "--prompt")) { if (!VAL()) return 2; prompt = v; }
        else if (!strcmp(a, "--chat")) { if (!VAL()) return 2; chat = v; }
        else if (!strcmp(a, "--system")) { if (!VAL()) return 2; system = v; }
        else if (!strcmp(a, "--enable-thinking")) { if (!VAL()) return 2; thinking = v; }
        else if (!strcmp(a, "--tokens")) { if (!VAL()) return 2; toks = v; }
        FLT("--temperature", 0, 100, sp.temperature)
        FLT("--top-p", 0, 1, sp.top_p)
        FLT("--min-p", 0, 1, sp.min_p)
        FLT("--repetition-penalty", 0.01, 100, sp.repetition_penalty)
        FLT("--presence-penalty", -100, 100, sp.presence_penalty)
        FLT("--frequency-penalty", -100, 100, sp.frequency_penalty)
        INT("--top-k", 0, 1 << 30, sp.top_k)
        INT("--repetition-context-size", 1, 1 << 20, sp.repetition_context_size)
        INT("--max-tokens", 1, 1 << 24, max_tokens)
        INT("--threads", 1, 1024, threads)
        INT("--ctx", 1, 1 << 24, ctx)
        INT("--logprobs", 0, EXO_MAX_TOP_LOGPROBS, lp)
        else if (!strcmp(a, "--seed")) {
            if (!VAL() || exo_arg_int("run", "--seed", v, 0, __LONG_MAX__, &l))
                return 2;
            sp.seed = (uint64_t)l;
        }
        else if (!strcmp(a, "--print-ids")) print_ids = true;
        else if (!strcmp(a, "--stats")) stats_flag = true;
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = true;
        else if (a[0] == '-' || dir) {
            fprintf(stderr, "exo run: unexpected argument '%s'\n", a);
            usage();
            return 2;
        } else {
            dir = a;
        }
#undef VAL
#undef FLT
#undef INT
    }
    if (!dir || (!!prompt + !!chat + !!toks) != 1) {
        usage();
        return 2;
    }
    if (thinking && strcmp(thinking, "true") && strcmp(thinking, "false")) {
        fprintf(stderr, "exo run: --enable-thinking expects true or false\n");
        return 2;
    }
    sp.top_logprobs = (int)lp;

    int status = 1;
    exo_err err = {0};
    exo_tokenizer *tok = NULL;
    exo_model *m = NULL;
    exo_seq *seq = NULL;
    int32_t *ids = NULL;
    int n_ids = 0;
    char *rendered = NULL;
    run_out out = {0};
    int64_t eos[EXO_CONFIG_MAX_EOS + 2];
    int n_eos = 0;

    if (has_file(dir, "tokenizer.json") && exo_tokenizer_load(dir, &tok, &err))
        goto fail;
    if ((prompt || chat) && !tok) {
        exo_err_set(&err, EXO_ENOENT, "%s has no tokenizer.json; use --tokens", dir);
        goto fail;
    }
    if (toks) {
        if (exo_arg_ids("run", toks, &ids, &n_ids))
            goto done;
    } else {
        const char *text = prompt;
        bool add_special = true;
        if (chat) {
            exo_chat_template *tpl = NULL;
            if (exo_chat_template_load(dir, &tpl, &err))
                goto fail;
            json_t *msgs = json_array();
            if (system)
                json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system));
            json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", chat));
            json_t *extra = json_object();
            if (thinking)
                json_object_set_new(extra, "enable_thinking", json_boolean(!strcmp(thinking, "true")));
            int rc = exo_chat_template_render(tpl, msgs, NULL, true, extra, &rendered, &err);
            json_decref(msgs);
            json_decref(extra);
            exo_chat_template_free(tpl);
            if (rc)
                goto fail;
            text = rendered;
            add_special = false; /* the template already carries BOS where wanted */
        }
        size_t n;
        if (exo_tokenizer_encode(tok, text, strlen(text), add_special, &ids, &n, &err))
            goto fail;
        n_ids = (int)n;
        if (!n_ids) {
            exo_err_set(&err, EXO_EINVAL, "the prompt encodes to no tokens");
            goto fail;
        }
    }

    exo_model_opts opts = {.n_threads = (int)threads};
    if (exo_model_load(dir, &opts, &m, &err))
        goto fail;
    const exo_model_config *cfg = exo_model_get_config(m);
    if (!ignore_eos) {
        for (int i = 0; i < cfg->n_eos; i++)
            eos[n_eos++] = cfg->eos_token_ids[i];
        const int32_t *tk_eos;
        size_t nt = tok ? exo_tokenizer_eos_ids(tok, &tk_eos) : 0;
        for (size_t i = 0; i < nt; i++)
            eos[n_eos++] = tk_eos[i];
    }
    long cap = ctx ? ctx : n_ids + max_tokens;
    if (cap < n_ids + 1) {
        exo_err_set(&err, EXO_ERANGE, "--ctx %ld is smaller than the prompt (%d tokens)", cap, n_ids);
        goto fail;
    }
    if (exo_seq_create(m, (int)cap, &seq, &err))
        goto fail;
    out.print_ids = print_ids;
    out.logprobs = (int)lp;
    out.tok = tok;
    if (tok && !print_ids)
        out.ds = exo_detok_stream_new(tok, true);
    exo_gen_params gp = {.sampling = sp, .max_tokens = (int)max_tokens, .eos_ids = eos, .n_eos = n_eos};
    exo_gen_stats st;
    if (exo_generate(m, seq, ids, n_ids, &gp, on_token, &out, &st, &err))
        goto fail;
    if (out.ds) {
        size_t len;
        const char *rest = exo_detok_stream_flush(out.ds, &len);
        fwrite(rest, 1, len, stdout);
    }
    printf("\n");
    if (stats_flag)
        fprintf(stderr,
                "prompt %d tokens in %.3f s (%.1f tok/s), generated %d tokens in %.3f s "
                "(%.1f tok/s), finish: %s\n",
                st.prompt_tokens, st.prefill_seconds,
                st.prefill_seconds > 0 ? st.prompt_tokens / st.prefill_seconds : 0,
                st.generated_tokens, st.decode_seconds,
                st.decode_seconds > 0 && st.generated_tokens > 1
                    ? (st.generated_tokens - 1) / st.decode_seconds : 0,
                exo_finish_name(st.finish));
    status = 0;
    goto done;
fail:
    fprintf(stderr, "exo run: %s\n", err.msg[0] ? err.msg : exo_strerror(err.code));
done:
    exo_detok_stream_free(out.ds);
    exo_seq_free(seq);
    exo_model_free(m);
    exo_tokenizer_free(tok);
    exo_free(ids);
    exo_free(rendered);
    return status;
}
