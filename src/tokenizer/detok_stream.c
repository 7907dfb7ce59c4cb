/* Streaming detokenizer: generated ids in, printable text pieces out.
 *
 * Decoding token by token is wrong in two ways: a token may end in the
 * middle of a UTF-8 character (byte-level and byte-fallback models split
 * emoji and CJK across tokens), and decoders look at context (Metaspace and
 * Strip drop the leading space of the first token only). So, like HF's
 * DecodeStream, we keep a short window of ids, decode the window, and emit
 * what it adds beyond the decoding of its older part (the prefix). While the
 * decoded window ends in U+FFFD (an incomplete character decodes to that),
 * nothing is emitted: the next token may complete it. When something is
 * emitted, the window drops everything but the tokens after the previous
 * prefix, so it stays a few tokens long and each push costs O(1) decodes.
 * flush() emits whatever is still held back (then the U+FFFD is real), so
 * the concatenated output always equals decode(all ids). */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"

#include <string.h>

struct exo_detok_stream {
    const exo_tokenizer *tok;
    bool                 skip_special;
    exo_tok_ids          ids;
    size_t               prefix_index;
    exo_tok_buf          prefix; /* decode(ids) as of the last emission */
    exo_tok_buf          cur;
    exo_tok_buf          piece;  /* returned to the caller */
};

exo_detok_stream *exo_detok_stream_new(const exo_tokenizer *tok, bool skip_special)
{
    exo_detok_stream *ds = exo_calloc(1, sizeof *ds);
    ds->tok          = tok;
    ds->skip_special = skip_special;
    exo_tok_buf_reserve(&ds->piece, 1);
    return ds;
}

void exo_detok_stream_free(exo_detok_stream *ds)
{
    if (!ds)
        return;
    exo_free(ds->ids.v);
    exo_tok_buf_free(&ds->prefix);
    exo_tok_buf_free(&ds->cur);
    exo_tok_buf_free(&ds->piece);
    exo_free(ds);
}

static bool ends_with_fffd(const exo_tok_buf *b)
{
    return b->len >= 3 && !memcmp(b->p + b->len - 3, "\xEF\xBF\xBD", 3);
}

/* Emits cur minus the prefix into piece. When the decoders rewrote the
 * prefix (not expected for supported decoders) the common part is skipped. */
static void emit_diff(exo_detok_stream *ds)
{
    size_t k = 0, lim = ds->prefix.len < ds->cur.len ? ds->prefix.len : ds->cur.len;
    while (k < lim && ds->prefix.p[k] == ds->cur.p[k])
        k++;
    /* never start a piece inside a character */
    while (k > 0 && k < ds->cur.len && ((unsigned char)ds->cur.p[k] & 0xC0) == 0x80)
        k--;
    if (k < ds->cur.len) /* cur.p is NULL while cur is empty */
        exo_tok_buf_put(&ds->piece, ds->cur.p + k, ds->cur.len - k);
}

const char *exo_detok_stream_push(exo_detok_stream *ds, int32_t id, size_t *len)
{
    ds->piece.len = 0;
    exo_tok_ids_push(&ds->ids, id);
    ds->cur.len = 0;
    exo_tok_decode_into(ds->tok, ds->ids.v, ds->ids.n, ds->skip_special, &ds->cur);
    if (ds->cur.len > ds->prefix.len && !ends_with_fffd(&ds->cur)) {
        emit_diff(ds);
        size_t new_prefix_index = ds->ids.n - ds->prefix_index;
        memmove(ds->ids.v, ds->ids.v + ds->prefix_index,
                (ds->ids.n - ds->prefix_index) * sizeof *ds->ids.v);
        ds->ids.n -= ds->prefix_index;
        ds->prefix.len = 0;
        exo_tok_decode_into(ds->tok, ds->ids.v, ds->ids.n, ds->skip_special, &ds->prefix);
        ds->prefix_index = new_prefix_index;
    }
    exo_tok_buf_reserve(&ds->piece, 1);
    ds->piece.p[ds->piece.len] = 0;
    *len = ds->piece.len;
    return ds->piece.p;
}

const char *exo_detok_stream_flush(exo_detok_stream *ds, size_t *len)
{
    ds->piece.len = 0;
    ds->cur.len   = 0;
    exo_tok_decode_into(ds->tok, ds->ids.v, ds->ids.n, ds->skip_special, &ds->cur);
    if (ds->cur.len > ds->prefix.len)
        emit_diff(ds);
    ds->ids.n        = 0;
    ds->prefix_index = 0;
    ds->prefix.len   = 0;
    exo_tok_buf_reserve(&ds->piece, 1);
    ds->piece.p[ds->piece.len] = 0;
    *len = ds->piece.len;
    return ds->piece.p;
}
