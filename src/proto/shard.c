/* The shard -> tensors rule (see shard.h). */
#include "proto/shard.h"

#include <stdlib.h>
#include <string.h>

long exo_tensor_layer(const char *name)
{
    for (const char *s = strstr(name, "layers."); s; s = strstr(s + 1, "layers.")) {
        char *end;
        const char *digits = s + 7;
        if (*digits < '0' || *digits > '9')
            continue;
        long v = strtol(digits, &end, 10);
        if (*end == '.')
            return v;
    }
    return -1;
}

bool exo_layer_shard_needs(const exo_layer_shard *s, const char *name)
{
    long l = exo_tensor_layer(name);
    if (l >= 0)
        return l >= s->first && l < s->last;
    if (strstr(name, "embed_tokens"))
        return s->first == 0 || (s->last == s->total && s->tied);
    return s->last == s->total; /* the final norm, the head */
}
