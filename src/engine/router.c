/* A mixture-of-experts router's choice, in host memory: every backend
 * routes through this one function (the CUDA backend copies the logits
 * back first, since the host picks which experts' weights run), so the
 * experts chosen never depend on the device. */
#include "engine/router.h"

#include <math.h>
#include <stdbool.h>

static void top_k(const float *v, int n, int k, int32_t *idx)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++)
                taken |= idx[i] == e;
            if (!taken && (best < 0 || v[e] > v[best]))
                best = e;
        }
        idx[j] = best;
    }
}

void exo_moe_by_expert(int32_t *idx, float *w, int k)
{
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && idx[j - 1] > idx[j]; j--) {
            int32_t t = idx[j];
            float v = w[j];
            idx[j] = idx[j - 1];
            w[j] = w[j - 1];
            idx[j - 1] = t;
            w[j - 1] = v;
        }
}

int exo_moe_route_rows(const exo_moe_router *r, const float *logits, const float *bias, int T, int32_t *idx,
                       float *w)
{
    const int E = r->n_experts, k = r->k;
    float choice[4096];
    if (E > 4096 || k > E)
        return EXO_EINVAL;
    for (int t = 0; t < T; t++) {
        const float *l = logits + (size_t)t * (size_t)E;
        int32_t *ti = idx + (size_t)t * (size_t)k;
        float *tw = w + (size_t)t * (size_t)k;
        if (!r->sigmoid) { /* softmax: the order of probabilities is the order of logits */
            float mx = l[0];
            for (int e = 1; e < E; e++)
                mx = l[e] > mx ? l[e] : mx;
            float sum = 0;
            for (int e = 0; e < E; e++)
                sum += expf(l[e] - mx);
            top_k(l, E, k, ti);
            for (int j = 0; j < k; j++)
                tw[j] = expf(l[ti[j]] - mx) / sum;
        } else {
            for (int e = 0; e < E; e++)
                choice[e] = 1.0f / (1.0f + expf(-l[e])) + (bias ? bias[e] : 0.0f);
            if (r->n_group > 1 && r->topk_group < r->n_group) {
                /* keep the topk_group groups whose two best choices sum highest */
                int per = E / r->n_group;
                float gscore[256];
                int32_t gbest[2], keep[256];
                for (int g = 0; g < r->n_group; g++) {
                    top_k(choice + g * per, per, per < 2 ? 1 : 2, gbest);
                    gscore[g] = choice[g * per + gbest[0]] + (per < 2 ? 0 : choice[g * per + gbest[1]]);
                }
                top_k(gscore, r->n_group, r->topk_group, keep);
                for (int g = 0; g < r->n_group; g++) {
                    bool kept = false;
                    for (int i = 0; i < r->topk_group; i++)
                        kept |= keep[i] == g;
                    if (!kept)
                        for (int e = g * per; e < (g + 1) * per; e++)
                            choice[e] = -INFINITY; /* as transformers 5 masks them */
                }
            }
            top_k(choice, E, k, ti);
            for (int j = 0; j < k; j++)
                tw[j] = 1.0f / (1.0f + expf(-l[ti[j]]));
        }
        if (r->norm) {
            float picked = 0;
            for (int j = 0; j < k; j++)
                picked += tw[j];
            for (int j = 0; j < k; j++)
                tw[j] /= picked + (r->sigmoid ? 1e-20f : 0.0f);
        }
        for (int j = 0; j < k; j++)
            tw[j] *= r->scale;
    }
    return 0;
}

