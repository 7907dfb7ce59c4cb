/* RoPE inverse frequencies (see rope.h). Formulas follow transformers'
 * modeling_rope_utils.py; the base frequencies are computed the way torch
 * does (f32 exponent, then 1/base^x), so angles match to the last bit or
 * close to it. */
#include "engine/rope.h"

#include <math.h>

static double yarn_get_mscale(double scale, double m)
{
    if (scale <= 1.0)
        return 1.0;
    return 0.1 * m * log(scale) + 1.0;
}

static double yarn_correction_dim(double n_rot, int dim, double base, double max_pos)
{
    return (dim * log(max_pos / (n_rot * 2.0 * M_PI))) / (2.0 * log(base));
}

int exo_rope_init(const exo_rope_scaling *p, double theta, int rot_dim, float *inv_freq,
                  float *mscale, exo_err *err)
{
    int half = rot_dim / 2;
    if (rot_dim <= 0 || rot_dim % 2 || theta <= 0)
        return exo_err_set(err, EXO_EINVAL, "rope: bad rotary dim %d or theta %g", rot_dim, theta);
    for (int i = 0; i < half; i++) {
        float expo = (float)(2 * i) / (float)rot_dim;
        inv_freq[i] = (float)(1.0 / pow(theta, (double)expo));
    }
    *mscale = 1.0f;
    switch (p->type) {
    case EXO_ROPE_DYNAMIC:
        return exo_err_set(err, EXO_EUNSUPPORTED, "rope: dynamic NTK scaling is not implemented");
    case EXO_ROPE_DEFAULT:
        break;
    case EXO_ROPE_LINEAR:
        if (p->factor <= 0)
            return exo_err_set(err, EXO_EINVAL, "rope linear: factor must be > 0");
        for (int i = 0; i < half; i++)
            inv_freq[i] = (float)(inv_freq[i] / p->factor);
        break;
    case EXO_ROPE_LLAMA3: {
        double factor = p->factor, lo = p->low_freq_factor, hi = p->high_freq_factor;
        double old_ctx = (double)p->original_max_position_embeddings;
        if (factor <= 0 || old_ctx <= 0 || hi == lo)
            return exo_err_set(err, EXO_EINVAL, "rope llama3: bad factor/low/high/original_max");
        double low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
        for (int i = 0; i < half; i++) {
            double f = inv_freq[i], wavelen = 2.0 * M_PI / f;
            double scaled = wavelen > low_wavelen ? f / factor : f;
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
                double smooth = (old_ctx / wavelen - lo) / (hi - lo);
                scaled = (1.0 - smooth) * scaled / factor + smooth * scaled;
            }
            inv_freq[i] = (float)scaled;
        }
        break;
    }
    case EXO_ROPE_YARN: {
        double factor = p->factor, base = theta;
        double max_pos = (double)p->original_max_position_embeddings;
        if (factor <= 0 || max_pos <= 0)
            return exo_err_set(err, EXO_EINVAL, "rope yarn: bad factor/original_max");
        double beta_fast = p->beta_fast > 0 ? p->beta_fast : 32.0;
        double beta_slow = p->beta_slow > 0 ? p->beta_slow : 1.0;
        double attn = p->attention_factor;
        if (attn <= 0) {
            if (p->mscale > 0 && p->mscale_all_dim > 0)
                attn = yarn_get_mscale(factor, p->mscale) / yarn_get_mscale(factor, p->mscale_all_dim);
            else
                attn = yarn_get_mscale(factor, 1.0);
        }
        double low = yarn_correction_dim(beta_fast, rot_dim, base, max_pos);
        double high = yarn_correction_dim(beta_slow, rot_dim, base, max_pos);
        if (!p->yarn_no_truncate) { /* the default; gpt-oss says "truncate": false */
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0)
            low = 0;
        if (high > rot_dim - 1)
            high = rot_dim - 1;
        if (low == high)
            high += 0.001;
        for (int i = 0; i < half; i++) {
            double extra = inv_freq[i], inter = extra / factor;
            double ramp = ((double)i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extra_factor = 1.0 - ramp;
            inv_freq[i] = (float)(inter * (1.0 - extra_factor) + extra * extra_factor);
        }
        *mscale = (float)attn;
        break;
    }
    }
    return 0;
}
