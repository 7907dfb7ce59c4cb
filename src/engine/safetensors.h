/* Reading and writing safetensors checkpoints.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of
 * JSON ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * optional "__metadata__": {string: string}}), then the raw tensor bytes;
 * offsets are relative to the start of that data section.
 *
 * Reader: files are mmapped read-only and tensors point straight into the
 * mapping (zero copy), so an exo_st must outlive every pointer taken from it.
 * The header is validated strictly before anything is exposed: every
 * failure is an exo_err naming the file and, where there is one, the tensor.
 * A model directory is opened as a whole: one model.safetensors, shards
 * listed by model.safetensors.index.json ("weight_map": name -> file), or
 * failing both every *.safetensors in it. Names are unique across shards;
 * lookup by name is a hash table, so thousands of tensors cost nothing.
 *
 * ALIGNMENT: safetensors does not require tensor data to be aligned, so
 * exo_st_tensor.data may be misaligned for its dtype (files written by exo
 * and by the reference library are aligned, arbitrary files need not be).
 * Read elements with memcpy, or check alignment before casting.
 *
 * Writer: collects (name, dtype, shape, bytes) entries and writes them in
 * one go to `path.tmp`, fsyncs and renames it over `path`, so no partial
 * file ever exists under the final name. Layout follows the reference
 * (Rust/Python) library: tensors ordered by dtype width, widest first, then
 * by name; header padded with spaces to a multiple of 8 bytes. With that
 * order every tensor is naturally aligned inside the file. */
#ifndef EXO_ENGINE_SAFETENSORS_H
#define EXO_ENGINE_SAFETENSORS_H

#include "core/error.h"
#include "engine/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EXO_ST_MAX_DIMS 8
/* Largest JSON header accepted (the reference library's limit). */
#define EXO_ST_MAX_HEADER ((size_t)100 * 1000 * 1000)

typedef struct exo_st exo_st;

/* One tensor, read-only, owned by its exo_st. */
typedef struct exo_st_tensor {
    const char *name;
    exo_dtype   dtype;
    int         ndim;                    /* 0 for a scalar */
    int64_t     shape[EXO_ST_MAX_DIMS];  /* entries past ndim are 0 */
    const void *data;                    /* may be unaligned, see above */
    size_t      nbytes;                  /* product(shape) * dtype size */
    const char *file;                    /* path of the file holding it */
} exo_st_tensor;

/* Opens a .safetensors file or a model directory (see above).
 * Errors: EXO_ENOENT (no such path / no safetensors in the directory),
 * EXO_EIO, EXO_EFORMAT (malformed header, bad index, duplicate names),
 * EXO_ETOOBIG (header over EXO_ST_MAX_HEADER), EXO_EUNSUPPORTED (a
 * safetensors dtype exo has no type for, such as F8_E4M3, or more than
 * EXO_ST_MAX_DIMS dimensions). */
int exo_st_open(const char *path_file_or_dir, exo_st **out, exo_err *err);

/* exo_st_open, for a shard of a model: with an index, only the files that
 * hold a tensor keep(ctx, name) wants are opened, and only those need to
 * exist (a node that downloaded its shard's files has just those); the
 * tensors of files opened anyway (a single file, no index) all stay
 * visible. keep NULL: every file. */
typedef bool (*exo_st_keep_fn)(void *ctx, const char *tensor_name);
int exo_st_open_filtered(const char *path_file_or_dir, exo_st_keep_fn keep, void *ctx, exo_st **out,
                         exo_err *err);

/* Parses a safetensors image already in memory. Nothing is copied: `data`
 * must stay valid and unchanged until exo_st_close. `name` is used in error
 * messages and as exo_st_tensor.file. Same errors as exo_st_open. */
int exo_st_open_memory(const void *data, size_t len, const char *name, exo_st **out,
                       exo_err *err);

void exo_st_close(exo_st *st);
/* Unmaps the file pages from this process without closing (MADV_DONTNEED:
 * they stay in the page cache; a later read faults them back in), for
 * callers that copied what they need. */
void exo_st_drop_pages(exo_st *st);

size_t exo_st_count(const exo_st *st);
/* Tensors in a stable order: by file, then by offset within the file.
 * NULL when i >= count. */
const exo_st_tensor *exo_st_at(const exo_st *st, size_t i);
/* NULL if there is no tensor of that name. */
const exo_st_tensor *exo_st_find(const exo_st *st, const char *name);
/* A "__metadata__" value (first file that has the key, in open order), or
 * NULL. */
const char *exo_st_metadata(const exo_st *st, const char *key);
/* Number of files the tensors come from. */
size_t exo_st_file_count(const exo_st *st);

/* ---- writer ---- */

typedef struct exo_st_writer exo_st_writer;

exo_st_writer *exo_st_writer_new(void);
void exo_st_writer_free(exo_st_writer *w);

/* Adds a "__metadata__" entry (e.g. "format" = "pt"); both strings are
 * copied. A second value for the same key replaces the first. */
void exo_st_writer_set_metadata(exo_st_writer *w, const char *key, const char *value);

/* Adds a tensor. nbytes must equal product(shape) * dtype size; names must
 * be unique and not "__metadata__". The name and shape are copied.
 *   _add:       data is borrowed and must stay valid until write/free.
 *   _add_copy:  data is copied now (EXO_ENOMEM if that fails).
 *   _add_owned: data was allocated with exo_malloc/exo_try_malloc and is
 *               freed by the writer (also when this call fails).
 * Errors: EXO_EINVAL (bad name, dtype, shape or size), EXO_ENOMEM. */
int exo_st_writer_add(exo_st_writer *w, const char *name, exo_dtype dtype, int ndim,
                      const int64_t *shape, const void *data, size_t nbytes, exo_err *err);
int exo_st_writer_add_copy(exo_st_writer *w, const char *name, exo_dtype dtype, int ndim,
                           const int64_t *shape, const void *data, size_t nbytes, exo_err *err);
int exo_st_writer_add_owned(exo_st_writer *w, const char *name, exo_dtype dtype, int ndim,
                            const int64_t *shape, void *data, size_t nbytes, exo_err *err);

/* Produces a deferred tensor's bytes at write time: fills dst (nbytes, as
 * declared) and returns 0, or a negative EXO_E* code (set err) to abort the
 * write. */
typedef int (*exo_st_fill_fn)(void *ctx, const char *name, void *dst, size_t nbytes,
                              exo_err *err);

/* Adds a tensor whose bytes are produced by fill(ctx, ...) during
 * exo_st_writer_write, one tensor at a time, so a converter (quantize,
 * convert-llama2c) never holds more than one output tensor in memory.
 * ctx must stay valid until write/free. Errors as for exo_st_writer_add. */
int exo_st_writer_add_deferred(exo_st_writer *w, const char *name, exo_dtype dtype, int ndim,
                               const int64_t *shape, size_t nbytes, exo_st_fill_fn fill,
                               void *ctx, exo_err *err);

size_t exo_st_writer_count(const exo_st_writer *w);

/* Writes everything to `path` (via path.tmp + fsync + rename). The writer
 * keeps its entries and may write again. Errors: EXO_EIO, EXO_EINVAL (a
 * name or metadata string that is not valid UTF-8), EXO_ENOMEM. */
int exo_st_writer_write(exo_st_writer *w, const char *path, exo_err *err);

#endif
