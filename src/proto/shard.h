/* Which tensors of a checkpoint a pipeline shard needs. The engine loads
 * exactly these (engine/model.c) and the downloader fetches only the files
 * that hold them (download/downloader.c): one rule, so a node never
 * downloads less than it will load.
 *
 * A shard holds layers [first, last) of total. Tensor names follow Hugging
 * Face's "...layers.<n>...." convention (any prefix: multimodal wrappers keep
 * the text model under another one). The embedding is needed by the first
 * shard, and by the last when the head is tied to it; every other
 * non-layer tensor (the final norm, the head) by the last shard only. A
 * tensor-parallel rank holds a share of every layer: first 0, last total. */
#ifndef EXO_PROTO_SHARD_H
#define EXO_PROTO_SHARD_H

#include <stdbool.h>

typedef struct exo_layer_shard {
    int  first, last, total;
    bool tied; /* config.json tie_word_embeddings */
} exo_layer_shard;

/* The layer index in a tensor name ("model.layers.12.mlp..." -> 12), or -1. */
long exo_tensor_layer(const char *tensor_name);
bool exo_layer_shard_needs(const exo_layer_shard *s, const char *tensor_name);

#endif
