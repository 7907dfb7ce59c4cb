#!/usr/bin/env python3
"""Make the reference fixtures under tests/fixtures/ with Hugging Face transformers.

What it makes (all from fixed seeds, so a re-run gives the same weights):

  <arch>-f32/      tiny random-weight model saved by transformers' save_pretrained
                   (model.safetensors, config.json, generation_config.json),
                   weights float32.
  <arch>-bf16/     the same weights rounded to bfloat16, saved as bf16.
  <arch>-q<B>g<G>/ an MLX-affine-quantized copy of <arch>-bf16 in the layout that
                   mlx-lm writes (uint32 packed `<module>.weight`, bf16
                   `<module>.scales` / `<module>.biases`, config.json with
                   "quantization" and "quantization_config").  The quantizer is
                   our own PyTorch re-implementation of MLX's mx.quantize
                   (mode "affine"); see mlx_affine_quantize() below.
  quant_vectors/   small matrices with the codes/scales/biases that quantizer makes,
                   for bit-exact unit tests of the C quantizer/dequantizer.

  arch: llama (llama3 RoPE scaling, untied lm_head), mistral (untied),
        qwen2 (q/k/v biases, tied embeddings), qwen3 (q_norm/k_norm, head_dim 64 != 128/4,
        tied embeddings), qwen3_moe (8 experts top-2 in layers 0 and 2, a dense layer 1;
        quantized copies stack the experts as mlx-lm's switch_mlp).

  New architectures (--archs new, or a comma list; see NEW_ARCHS and tests/fixtures/README.md):
        qwen3_next, qwen3_5_moe and qwen3_5 (hub wrapper layout), gemma3 (+ gemma3_mm-bf16),
        gpt_oss (+ gpt_oss-mxfp4 in the hub MXFP4 layout and gpt_oss-mlx-mxfp4q8 in the
        mlx-community MXFP4-Q8 layout), glm4_moe, deepseek_v3; each with -f32, -bf16 and MLX
        -q4g64/-q8g64 copies laid out as mlx-lm's sanitize() leaves that arch. They use an
        80-token prompt (PROMPT_IDS_LONG) instead of the 12-token one.

        PYTHONUNBUFFERED=1 python3 tools/make_fixtures.py --archs new --out /tmp/fx
        python3 tools/make_fixtures.py --archs new --pack /tmp/fx --out DIR   # tarballs <= 15 MB

Every model dir also gets reference.json + reference_logits.f32: the logits of a
fixed 12-token prompt ([T, vocab] float32 little-endian, row-major) and a greedy
continuation of 24 tokens with the top1-top2 logit margin of each step, plus
reference_sequence_logits.f32: the logits [T+24, vocab] of one forward pass over
prompt + greedy tokens (teacher forcing, for checking the decode path even where a
greedy step is a near-tie), all computed
by transformers in float32 on the CPU (eager attention).  For bf16 dirs the weights
are the stored bf16 values upcast to float32; for quantized dirs they are the
dequantized weights w = scale*q + bias (float32, from the stored bf16 scales/biases).
The JSON format is described in tests/fixtures/README.md.

How to run (needs torch, transformers 5.x, safetensors, numpy; no GPU is needed,
everything runs on the CPU so the float32 arithmetic is plain IEEE):

    PYTHONUNBUFFERED=1 python3 tools/make_fixtures.py --out /tmp/fx
    tar -C /tmp/fx -czf fixtures.tgz .      # then unpack into tests/fixtures/

We ran it on the project's GPU lending machine (the only place with torch), as
`run` with: PYTHONUNBUFFERED=1 python3 tools/make_fixtures.py --out /tmp/fx &&
tar -C /tmp/fx -czf $OUT/fixtures.tgz .   Check the result here with
tools/check_fixtures.py (numpy only).

Sources for the MLX affine quantization (read for facts, nothing copied):
  - ml-explore/mlx  mlx/ops.cpp: affine_quantize() (its fallback lambda) and
    pack_and_quantize(); affine_dequantize() for the unpacking.
  - ml-explore/mlx  mlx/backend/cpu/quantized.cpp: template quantize<T, U>() (the
    CPU kernel: per-group min/max in float, rint, clamp, LSB-first bit packing; 3/5/6
    bits written as byte packs of 3/5/3 bytes, i.e. one continuous little-endian bit
    stream) and mlx/backend/common/quantized.h get_pack_factor/get_bytes_per_pack.
  - ml-explore/mlx  mlx/backend/metal/kernels/quantized.h affine_quantize (the GPU
    kernel, same formulas; see the notes in tests/fixtures/README.md).
  - ml-explore/mlx  python/mlx/nn/layers/quantized.py: nn.quantize quantizes every
    module with to_quantized() (Linear and Embedding).
  - ml-explore/mlx-lm  mlx_lm/utils.py: quantize_model() (skips modules whose
    weight.shape[-1] % group_size != 0; writes config["quantization"] =
    {"group_size", "bits", "mode"} and copies it to "quantization_config"),
    save_model() (tensor names are the flattened parameter names: <module>.weight,
    <module>.scales, <module>.biases; metadata {"format": "mlx"}), save_config(),
    and save() (copies generation_config.json).
"""

import argparse
import copy
import json
import os
import struct
import sys
import traceback

import numpy as np
import torch

import transformers
from safetensors.torch import load_file
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

PROMPT_IDS = [1, 17, 250, 3, 99, 42, 318, 7, 128, 64, 200, 5]
N_NEW = 24
VOCAB = 320

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    hidden_act="silu",
    initializer_range=0.1,
    bos_token_id=1,
    eos_token_id=2,
)

# arch -> (config class, model class, extra config, rope parameters, seed)
ARCHS = {
    "llama": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(rms_norm_eps=1e-5, tie_word_embeddings=False, head_dim=32),
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        1001,
    ),
    "mistral": (
        MistralConfig,
        MistralForCausalLM,
        dict(rms_norm_eps=1e-5, tie_word_embeddings=False, head_dim=32, sliding_window=None),
        {"rope_type": "default", "rope_theta": 10000.0},
        1002,
    ),
    "qwen2": (
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False),
        {"rope_type": "default", "rope_theta": 1000000.0},
        1003,
    ),
    "qwen3": (
        Qwen3Config,
        Qwen3ForCausalLM,
        dict(rms_norm_eps=1e-6, tie_word_embeddings=True, head_dim=64, use_sliding_window=False),
        {"rope_type": "default", "rope_theta": 1000000.0},
        1004,
    ),
    # 3 layers: two sparse (8 experts, top 2, renormalised), the middle one dense
    # (mlp_only_layers), so both MLP kinds and the routing are checked.
    "qwen3_moe": (
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        dict(rms_norm_eps=1e-6, tie_word_embeddings=False, head_dim=32, use_sliding_window=False,
             num_hidden_layers=3, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
             norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1]),
        {"rope_type": "default", "rope_theta": 1000000.0},
        1005,
    ),
}

QUANT_DIRS = [("llama", b, g) for b in (2, 3, 4, 5, 6, 8) for g in (32, 64, 128)] + [
    ("mistral", 4, 64),
    ("qwen2", 4, 64),
    ("qwen3", 4, 64),
    ("qwen3", 8, 32),
    ("qwen3_moe", 4, 64),
    ("qwen3_moe", 8, 64),
]


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------
# MLX affine quantization, re-implemented in PyTorch (CPU, float32).
# ----------------------------------------------------------------------------


def mlx_affine_quantize(w, group_size, bits):
    """Quantize a 2-D tensor like mx.quantize(w, group_size, bits, mode="affine").

    Returns (codes int64 [R, C] in [0, 2^bits-1], scales f32 [R, C/G], biases f32
    [R, C/G]).  The caller casts scales/biases to w's dtype, as MLX does (the codes
    are computed with the float32 scale/bias, before that cast).

    Per group of `group_size` consecutive values along the last axis, all in float32:
        w_min, w_max = min, max of the group (values upcast exactly from w's dtype)
        n_bins = 2^bits - 1
        scale  = max((w_max - w_min) / n_bins, 1e-7f)
        if |w_min| > |w_max|: edge = w_min            (scale stays positive)
        else:                 edge = w_max, scale = -scale
        q0 = rint(edge / scale)                       (round half to even)
        if q0 != 0: scale = edge / q0; bias = edge
        else:       bias = 0                          (scale unchanged)
        q  = clamp(rint((w - bias) / scale), 0, n_bins)
    Every division is a true IEEE float32 division (no reciprocal multiply): all
    divisors here are full tensors, never Python scalars.
    """
    assert w.dim() == 2
    R, C = w.shape
    assert C % group_size == 0
    wf = w.detach().to(device="cpu", dtype=torch.float32)
    g = wf.reshape(R, C // group_size, group_size)
    w_max = g.amax(dim=-1, keepdim=True)
    w_min = g.amin(dim=-1, keepdim=True)
    n_bins = torch.full_like(w_max, float((1 << bits) - 1))
    eps = torch.full_like(w_max, 1e-7)  # float32(1e-7), like `float eps = 1e-7;`
    zero = torch.zeros_like(w_max)
    mask = w_min.abs() > w_max.abs()
    scale = torch.maximum((w_max - w_min) / n_bins, eps)
    scale = torch.where(mask, scale, -scale)
    edge = torch.where(mask, w_min, w_max)
    q0 = torch.round(edge / scale)
    nz = q0 != 0
    safe_q0 = torch.where(nz, q0, torch.ones_like(q0))
    scale = torch.where(nz, edge / safe_q0, scale)
    bias = torch.where(nz, edge, zero)
    q = torch.round((g - bias) / scale)
    q = torch.minimum(torch.maximum(q, zero), n_bins)
    codes = q.to(torch.int64).reshape(R, C)
    return codes, scale.reshape(R, C // group_size), bias.reshape(R, C // group_size)


def pack_codes(codes, bits):
    """Pack [R, C] codes into uint32 words [R, C*bits/32] (returned as int64 values).

    Each row is one little-endian bit stream: code j of the row occupies bits
    [j*bits, (j+1)*bits) of the stream, LSB first; stream bit k is bit (k % 32) of
    word k // 32.  This is what MLX produces for every bit width (2/4/8: el_per_int
    codes per word; 3/5/6: 8/8/4 codes per 3/5/3-byte pack, same stream).
    """
    R, C = codes.shape
    assert (C * bits) % 32 == 0
    b = (codes.unsqueeze(-1) >> torch.arange(bits, dtype=torch.int64)) & 1  # [R, C, bits]
    b = b.reshape(R, C * bits // 32, 32)
    return (b << torch.arange(32, dtype=torch.int64)).sum(dim=-1)


def unpack_codes(words, bits, cols):
    R, W = words.shape
    b = (words.to(torch.int64).unsqueeze(-1) >> torch.arange(32, dtype=torch.int64)) & 1
    b = b.reshape(R, W * 32 // bits, bits)[:, :cols, :]
    return (b << torch.arange(bits, dtype=torch.int64)).sum(dim=-1)


def mlx_affine_dequantize(words, scales, biases, group_size, bits):
    """w = scale * q + bias in float32 (two roundings: product, then sum)."""
    R = words.shape[0]
    cols = words.shape[1] * 32 // bits
    q = unpack_codes(words, bits, cols).to(torch.float32).reshape(R, cols // group_size, group_size)
    s = scales.to(torch.float32).unsqueeze(-1)
    b = biases.to(torch.float32).unsqueeze(-1)
    prod = s * q
    return (prod + b).reshape(R, cols)


# ----------------------------------------------------------------------------
# safetensors writer (own, so uint32 works whatever the safetensors version)
# ----------------------------------------------------------------------------


def tensor_bytes(t):
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        return "BF16", t.view(torch.int16).numpy().astype("<i2").tobytes()
    if t.dtype == torch.float32:
        return "F32", t.numpy().astype("<f4").tobytes()
    raise TypeError(t.dtype)


def write_safetensors(path, tensors, metadata):
    """tensors: name -> (dtype string, shape list, raw little-endian bytes)."""
    names = sorted(tensors)
    header = {}
    off = 0
    for n in names:
        dt, shape, raw = tensors[n]
        header[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    header["__metadata__"] = metadata
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for n in names:
            f.write(tensors[n][2])


# ----------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------


def make_config(arch):
    cfg_cls, _, extra, rope, _ = ARCHS[arch]
    kw = dict(COMMON)
    kw.update(extra)
    try:
        cfg = cfg_cls(rope_parameters=dict(rope), **kw)
    except TypeError:
        # older API: rope_theta / rope_scaling
        legacy = dict(kw)
        legacy["rope_theta"] = rope["rope_theta"]
        if rope["rope_type"] != "default":
            legacy["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
        cfg = cfg_cls(**legacy)
    try:
        cfg._attn_implementation = "eager"
    except Exception as e:  # noqa: BLE001
        log("  (could not force eager attention:", e, ")")
    return cfg


def new_model(arch, cfg):
    _, model_cls, _, _, _ = ARCHS[arch]
    m = model_cls(copy.deepcopy(cfg))
    if getattr(m.config, "_attn_implementation", None) != "eager" and hasattr(m, "set_attn_implementation"):
        try:
            m.set_attn_implementation("eager")
        except Exception as e:  # noqa: BLE001
            log("  (set_attn_implementation failed:", e, ")")
    m.eval()
    if ARCHS[arch][2].get("tie_word_embeddings"):
        ensure_tied(m)
    return m


def ensure_tied(model):
    emb = model.model.embed_tokens.weight
    if model.lm_head.weight is not emb:
        try:
            model.tie_weights()
        except Exception:  # noqa: BLE001
            pass
    if model.lm_head.weight is not emb:
        model.lm_head.weight = emb
    assert model.lm_head.weight is model.model.embed_tokens.weight


def fill_random(model, seed):
    """Deterministic weights, independent of transformers' own init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights appear once
            shape = p.shape
            if name.endswith("mlp.gate.weight"):
                # routers: logits far apart, so no top-k choice is a near-tie
                v = 1.0 * torch.randn(shape, generator=g)
            elif name.endswith("norm.weight"):
                v = 1.0 + 0.1 * torch.randn(shape, generator=g)
            elif name.endswith(".bias"):
                v = 0.5 * torch.randn(shape, generator=g)
            elif "embed_tokens" in name or name.startswith("lm_head"):
                v = 0.2 * torch.randn(shape, generator=g)
            else:
                v = 0.1 * torch.randn(shape, generator=g)
            p.copy_(v.to(p.dtype))


def fix_config_json(path, dtype_name, quant=None):
    with open(path) as f:
        c = json.load(f)
    c["dtype"] = dtype_name
    c["torch_dtype"] = dtype_name  # key used by transformers 4.x checkpoints
    rp = c.get("rope_parameters")
    if isinstance(rp, dict) and "rope_theta" in rp:
        # also write the 4.x-style keys most hub checkpoints carry
        c.setdefault("rope_theta", rp["rope_theta"])
        if rp.get("rope_type", "default") != "default":
            c.setdefault("rope_scaling", {k: v for k, v in rp.items() if k != "rope_theta"})
    if quant is not None:
        c["quantization"] = dict(quant)
        c["quantization_config"] = dict(quant)
    c = dict(sorted(c.items()))
    with open(path, "w") as f:
        json.dump(c, f, indent=4)
        f.write("\n")


def to_model_keys(model, sd):
    """Checkpoints name each expert's projections (experts.E.gate_proj.weight, as
    save_pretrained writes and the hub holds); transformers 5 models hold them fused
    (experts.gate_up_proj [E, 2I, H] = gate rows then up rows, experts.down_proj)."""
    params = dict(model.named_parameters())
    out, experts = {}, {}
    for k, v in sd.items():
        parts = k.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            i = parts.index("experts")
            base = ".".join(parts[: i + 1])
            experts.setdefault(base, {})[(int(parts[i + 1]), parts[i + 2])] = v
        else:
            out[k] = v
    for base, d in experts.items():
        n = 1 + max(e for e, _ in d)
        if base + ".gate_up_proj" in params:
            out[base + ".gate_up_proj"] = torch.stack(
                [torch.cat([d[(e, "gate_proj")], d[(e, "up_proj")]], 0) for e in range(n)])
            out[base + ".down_proj"] = torch.stack([d[(e, "down_proj")] for e in range(n)])
        else:
            for (e, proj), v in d.items():
                out[f"{base}.{e}.{proj}.weight"] = v
    return out


def load_state_f32(model, state, tied):
    """Load a name->tensor dict (any float dtype) into a float32 model."""
    sd = to_model_keys(model, {k: v.to(torch.float32) for k, v in state.items()})
    res = model.load_state_dict(sd, strict=False)
    missing = [k for k in res.missing_keys if not k.endswith("rotary_emb.inv_freq")]
    allowed = {"lm_head.weight"} if tied else set()
    bad_missing = [k for k in missing if k not in allowed]
    if bad_missing or res.unexpected_keys:
        raise RuntimeError(f"state mismatch: missing {bad_missing} unexpected {res.unexpected_keys}")
    if tied:
        ensure_tied(model)
        assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)


@torch.no_grad()
def reference(model, prompt=None):
    """Prompt logits [T, V] and manual greedy decode (full recompute, argmax)."""
    ids = torch.tensor([prompt or PROMPT_IDS], dtype=torch.long)
    logits = model(input_ids=ids).logits[0].float().clone()
    greedy, margins = [], []
    cur = ids
    for _ in range(N_NEW):
        last = model(input_ids=cur).logits[0, -1].float()
        top = torch.topk(last, 2)
        nxt = int(top.indices[0])
        greedy.append(nxt)
        margins.append(float(top.values[0] - top.values[1]))
        cur = torch.cat([cur, torch.tensor([[nxt]], dtype=torch.long)], dim=1)
    # one forward over prompt + greedy tokens: teacher-forced logits for every position
    seq_logits = model(input_ids=cur).logits[0].float().clone()
    return logits, greedy, margins, seq_logits


@torch.no_grad()
def generate_check(model, prompt=None):
    """transformers' generate(do_sample=False), eos disabled, as a cross-check."""
    prompt = prompt or PROMPT_IDS
    ids = torch.tensor([prompt], dtype=torch.long)
    try:
        gc = copy.deepcopy(model.generation_config)
        gc.eos_token_id = None
        gc.do_sample = False
        gc.max_new_tokens = N_NEW
        gc.min_new_tokens = None
        gc.pad_token_id = 0
        model.generation_config.eos_token_id = None
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            generation_config=gc,
        )
        return [int(x) for x in out[0, len(prompt):]], None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def write_reference(d, model_type, dtype_name, logits, greedy, margins, seq_logits, extra, prompt=None):
    prompt = prompt or PROMPT_IDS
    logits.numpy().astype("<f4").tofile(os.path.join(d, "reference_logits.f32"))
    seq_logits.numpy().astype("<f4").tofile(os.path.join(d, "reference_sequence_logits.f32"))
    ref = {
        "model_type": model_type,
        "dtype": dtype_name,
        "prompt_ids": prompt,
        "logits_file": "reference_logits.f32",
        "logits_shape": list(logits.shape),
        "greedy_ids": greedy,
        "greedy_margins": margins,
        "bf16_native_max_abs_diff": None,
        "sequence_ids": prompt + greedy,
        "sequence_logits_file": "reference_sequence_logits.f32",
        "sequence_logits_shape": list(seq_logits.shape),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "compute": "cpu float32, eager attention, logits for every prompt position; "
        "greedy = argmax of the last-position logits, recomputed over the whole sequence each step",
    }
    ref.update(extra)
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


def run_reference(d, model, model_type, dtype_name, extra, prompt=None):
    logits, greedy, margins, seq_logits = reference(model, prompt)
    gen, err = generate_check(model, prompt)
    extra = dict(extra)
    extra["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    if gen is None:
        extra["generate_check"] = err
    else:
        extra["generate_ids"] = gen
        extra["generate_agrees"] = gen == greedy
    write_reference(d, model_type, dtype_name, logits, greedy, margins, seq_logits, extra, prompt)
    log(f"  {os.path.basename(d)}: logits {list(logits.shape)} absmax {logits.abs().max():.3f} "
        f"greedy {greedy[:8]}... min margin {min(margins):.4f} generate_agrees {extra.get('generate_agrees')}")
    return logits, greedy


def make_base(out, arch):
    cfg_cls, _, extra, _, seed = ARCHS[arch]
    cfg = make_config(arch)
    tied = bool(extra.get("tie_word_embeddings"))
    torch.manual_seed(seed)
    m = new_model(arch, cfg)
    fill_random(m, seed)
    model_type = m.config.model_type

    # ---- f32
    d32 = os.path.join(out, f"{arch}-f32")
    m.save_pretrained(d32)
    fix_config_json(os.path.join(d32, "config.json"), "float32")
    st32 = load_file(os.path.join(d32, "model.safetensors"))
    ref32 = new_model(arch, cfg)
    load_state_f32(ref32, st32, tied)
    for k, v in st32.items():
        assert v.dtype == torch.float32, k
    run_reference(d32, ref32, model_type, "float32", {"seed": seed})

    # ---- bf16
    d16 = os.path.join(out, f"{arch}-bf16")
    mb = copy.deepcopy(m).to(torch.bfloat16)
    mb.save_pretrained(d16)
    fix_config_json(os.path.join(d16, "config.json"), "bfloat16")
    st16 = load_file(os.path.join(d16, "model.safetensors"))
    for k, v in st16.items():
        assert v.dtype == torch.bfloat16, k
    ref16 = new_model(arch, cfg)
    load_state_f32(ref16, st16, tied)
    logits, greedy = run_reference(d16, ref16, model_type, "bfloat16", {"seed": seed})
    # native bf16 run, for information
    nat = new_model(arch, cfg).to(torch.bfloat16)
    res = nat.load_state_dict(to_model_keys(nat, st16), strict=False)
    if tied:
        ensure_tied(nat)
    with torch.no_grad():
        nl = nat(input_ids=torch.tensor([PROMPT_IDS])).logits[0].float()
    diff = float((nl - logits).abs().max())
    nat_greedy = reference(nat)[1]
    with open(os.path.join(d16, "reference.json")) as f:
        r = json.load(f)
    r["bf16_native_max_abs_diff"] = diff
    r["bf16_native_greedy_ids"] = nat_greedy
    r["bf16_native_greedy_agrees"] = nat_greedy == greedy
    with open(os.path.join(d16, "reference.json"), "w") as f:
        json.dump(r, f, indent=1)
        f.write("\n")
    log(f"  {arch}-bf16 native vs upcast: max abs diff {diff:.4f}, greedy agrees {nat_greedy == greedy}"
        f" (missing in native load: {res.missing_keys})")
    return cfg, tied, model_type, st16, d16


def make_quant(out, arch, bits, gs, cfg, tied, model_type, st16, d16):
    name = f"{arch}-q{bits}g{gs}"
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    tensors = {}
    deq = {}
    nq = 0
    for k, v in st16.items():
        if tied and k == "lm_head.weight":
            continue  # mlx-lm has no lm_head for tied embeddings
        if k.endswith(".weight") and v.dim() == 2 and v.shape[-1] % gs == 0:
            codes, sc, bi = mlx_affine_quantize(v, gs, bits)
            words = pack_codes(codes, bits)
            sc16 = sc.to(torch.bfloat16)
            bi16 = bi.to(torch.bfloat16)
            # round trip of our own packing
            assert torch.equal(unpack_codes(words, bits, v.shape[1]), codes)
            base = k[: -len(".weight")]
            tensors[k] = ("U32", list(words.shape), words.numpy().astype("<u4").tobytes())
            dt, raw = tensor_bytes(sc16)
            tensors[base + ".scales"] = (dt, list(sc16.shape), raw)
            dt, raw = tensor_bytes(bi16)
            tensors[base + ".biases"] = (dt, list(bi16.shape), raw)
            deq[k] = mlx_affine_dequantize(words, sc16, bi16, gs, bits)
            nq += 1
        else:
            dt, raw = tensor_bytes(v)
            tensors[k] = (dt, list(v.shape), raw)
            deq[k] = v.to(torch.float32)
    tensors = mlx_stack_experts(tensors)
    write_safetensors(os.path.join(d, "model.safetensors"), tensors, {"format": "mlx"})
    quant = {"group_size": gs, "bits": bits, "mode": "affine"}
    with open(os.path.join(d16, "config.json")) as f:
        c = json.load(f)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)
    fix_config_json(os.path.join(d, "config.json"), "bfloat16", quant)
    gpath = os.path.join(d16, "generation_config.json")
    if os.path.exists(gpath):
        with open(gpath) as f:
            gtxt = f.read()
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            f.write(gtxt)
    ref = new_model(arch, cfg)
    load_state_f32(ref, deq, tied)
    run_reference(d, ref, model_type, f"q{bits}g{gs}",
                  {"quantization": quant, "quantized_tensors": nq,
                   "base": os.path.basename(d16),
                   "reference_weights": "float32 scale*q + bias from the stored bf16 scales/biases"})


def mlx_stack_experts(tensors):
    """mlx-lm's sanitize() for MoE models: model.layers.L.mlp.experts.E.P.{weight,scales,biases}
    become model.layers.L.mlp.switch_mlp.P.{...} with a leading expert axis [E, rows, cols]
    (quantizing per expert then stacking is what quantizing the stack does: groups run
    along rows)."""
    out, groups = {}, {}
    for k, v in tensors.items():
        parts = k.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            i = parts.index("experts")
            key = ".".join(parts[:i]) + ".switch_mlp." + ".".join(parts[i + 2:])
            groups.setdefault(key, {})[int(parts[i + 1])] = v
        else:
            out[k] = v
    for key, d in groups.items():
        n = len(d)
        dt, shape, _ = d[0]
        assert all(d[e][0] == dt and d[e][1] == shape for e in range(n)), key
        out[key] = (dt, [n] + list(shape), b"".join(d[e][2] for e in range(n)))
    return out


def make_quant_vectors(out):
    """Small matrices: 8 rows x 128 cols.  Rows 0-3 random normal, row 4 zeros,
    row 5 constant 0.5, row 6 all negative, row 7 built so that (w - bias)/scale
    hits exact .5 ties (checks round-half-to-even)."""
    d = os.path.join(out, "quant_vectors")
    os.makedirs(d, exist_ok=True)
    cases = [(b, 32) for b in (2, 3, 4, 5, 6, 8)] + [(4, 64), (4, 128), (3, 64), (6, 128)]
    manifest = {"rows": 8, "cols": 128, "cases": [],
                "layout": "row-major little-endian; codes.u32 = packed uint32 words [rows, cols*bits/32]; "
                          "scales/biases [rows, cols/group_size]; dequant.f32 = float32(float32(scale*q)+bias)"}
    for bits, gs in cases:
        gen = torch.Generator().manual_seed(7000 + 100 * bits + gs)
        R, C = 8, 128
        w = torch.empty(R, C)
        w[0:4] = torch.randn(4, C, generator=gen) * torch.tensor([[0.02], [0.1], [1.0], [30.0]])
        w[4] = 0.0
        w[5] = 0.5
        w[6] = -(0.1 + torch.rand(C, generator=gen))
        n = (1 << bits) - 1
        tie = torch.empty(C)
        for gi in range(C // gs):
            vals = [0.0, float(n)] + [((j % n) + 0.5) for j in range(gs - 2)]
            tie[gi * gs:(gi + 1) * gs] = torch.tensor(vals)
        w[7] = tie * 0.25  # exact in binary, still ties
        for src in ("f32", "bf16"):
            wt = w if src == "f32" else w.to(torch.bfloat16)
            codes, sc, bi = mlx_affine_quantize(wt, gs, bits)
            words = pack_codes(codes, bits)
            sc_t = sc.to(wt.dtype)
            bi_t = bi.to(wt.dtype)
            deq = mlx_affine_dequantize(words, sc_t, bi_t, gs, bits)
            sub = os.path.join(d, f"b{bits}_g{gs}_{src}")
            os.makedirs(sub, exist_ok=True)
            ext = "f32" if src == "f32" else "bf16"

            def dump(t, fname):
                if t.dtype == torch.bfloat16:
                    t.contiguous().view(torch.int16).numpy().astype("<i2").tofile(os.path.join(sub, fname))
                else:
                    t.contiguous().numpy().astype("<f4").tofile(os.path.join(sub, fname))

            dump(wt, f"input.{ext}")
            words.numpy().astype("<u4").tofile(os.path.join(sub, "codes.u32"))
            codes.numpy().astype("u1").tofile(os.path.join(sub, "codes_unpacked.u8"))
            dump(sc_t, f"scales.{ext}")
            dump(bi_t, f"biases.{ext}")
            dump(deq, "dequant.f32")
            manifest["cases"].append({"dir": os.path.basename(sub), "bits": bits, "group_size": gs,
                                      "input_dtype": src, "rows": R, "cols": C,
                                      "words_per_row": C * bits // 32, "groups_per_row": C // gs})
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    log(f"  quant_vectors: {len(manifest['cases'])} cases")



# ============================================================================
# New architectures (issue: hybrid / MoE / MLA / sliding-window families).
#
#   qwen3_next   Qwen3NextForCausalLM: 3 Gated DeltaNet layers + 1 gated full-attention layer,
#                MoE (8 experts top 2 + sigmoid-gated shared expert), layer 1 dense.
#   qwen3_5_moe  Qwen3.5 MoE text model, written in the hub layout of Qwen/Qwen3.5-35B-A3B
#                (Qwen3_5MoeForConditionalGeneration names: model.language_model.*, fused
#                experts, text_config); reference from Qwen3_5MoeForCausalLM.
#   qwen3_5      dense Qwen3.5 (same wrapper layout), tied embeddings.
#   gemma3       Gemma3ForCausalLM: 5 sliding (window 8) + 1 global layer, query_pre_attn_scalar 24,
#                local rope 1e4 / global 1e6 linear x8, tied; plus gemma3_mm-bf16 (wrapper layout).
#   gpt_oss      GptOssForCausalLM: sliding/full alternation, sinks, yarn, biases, 8 experts top 2;
#                plus gpt_oss-mxfp4 (hub MXFP4 layout) and gpt_oss-mlx-mxfp4q8 (mlx-community layout).
#   glm4_moe     Glm4MoeForCausalLM: partial rope 0.5, qk-norm, q/k/v biases, sigmoid router with
#                correction bias, routed_scaling_factor 2.5, shared expert, layer 0 dense.
#   deepseek_v3  DeepseekV3ForCausalLM: MLA (q_lora 48, kv_lora 32), yarn x40, group-limited
#                sigmoid routing (16 experts, 4 groups, top-2 groups, top 4), layer 0 dense.
#
# Every new-arch dir uses the 80-token PROMPT_IDS_LONG (so the chunked linear-attention prefill,
# chunk 64, spans two chunks and the sliding windows of 8 matter) and 24 greedy tokens.
# MLX copies are laid out as mlx-lm's sanitize() + quantize_model() would leave them (see
# mlx_sanitize() below and tests/fixtures/README.md).
# ============================================================================

PROMPT_LONG_SEED = 31337
PROMPT_IDS_LONG = [1] + [int(t) for t in np.random.RandomState(PROMPT_LONG_SEED).randint(3, VOCAB, size=79)]

_Q35_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=128,
                   num_position_embeddings=16, patch_size=16)
_G3_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=32, patch_size=8)

_GDN_KW = dict(linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
               linear_num_key_heads=2, linear_num_value_heads=4, full_attention_interval=4)
_BASE_KW = dict(vocab_size=VOCAB, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=256, initializer_range=0.1, bos_token_id=1, eos_token_id=2)

NEW_ARCHS = {
    "qwen3_next": dict(
        config="Qwen3NextConfig", model="Qwen3NextForCausalLM", seed=1101, hub="save_pretrained",
        kw=dict(_BASE_KW, **_GDN_KW, intermediate_size=256, num_hidden_layers=4, head_dim=32, hidden_act="silu",
                rms_norm_eps=1e-6, tie_word_embeddings=False, partial_rotary_factor=0.25,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1]),
        legacy={"rope_theta": 1000000.0, "partial_rotary_factor": 0.25, "full_attention_interval": 4},
        offset_norms="qwen", router="softmax"),
    "qwen3_5_moe": dict(
        config="Qwen3_5MoeTextConfig", model="Qwen3_5MoeForCausalLM", seed=1102, hub="qwen3_5",
        wrapper_config="Qwen3_5MoeConfig", wrapper_model="Qwen3_5MoeForConditionalGeneration",
        kw=dict(_BASE_KW, **_GDN_KW, num_hidden_layers=4, head_dim=32, hidden_act="silu", rms_norm_eps=1e-6,
                tie_word_embeddings=False, partial_rotary_factor=0.25,
                rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "mrope_section": [2, 1, 1],
                                 "mrope_interleaved": True},
                num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64),
        legacy={"rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "full_attention_interval": 4},
        offset_norms="qwen", router="softmax"),
    "qwen3_5": dict(
        config="Qwen3_5TextConfig", model="Qwen3_5ForCausalLM", seed=1103, hub="qwen3_5",
        wrapper_config="Qwen3_5Config", wrapper_model="Qwen3_5ForConditionalGeneration",
        kw=dict(_BASE_KW, **_GDN_KW, intermediate_size=256, num_hidden_layers=4, head_dim=32, hidden_act="silu",
                rms_norm_eps=1e-6, tie_word_embeddings=True, partial_rotary_factor=0.25,
                rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "mrope_section": [2, 1, 1],
                                 "mrope_interleaved": True}),
        legacy={"rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "full_attention_interval": 4},
        offset_norms="qwen", router=None),
    "gemma3": dict(
        config="Gemma3TextConfig", model="Gemma3ForCausalLM", seed=2104, hub="save_pretrained",
        kw=dict(_BASE_KW, pad_token_id=0, intermediate_size=256, num_hidden_layers=6, head_dim=32,
                hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
                query_pre_attn_scalar=24, sliding_window=8, sliding_window_pattern=6,
                final_logit_softcapping=None, attn_logit_softcapping=None,
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}),
        legacy={"rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window_pattern": 6},
        # the input embedding is scaled by sqrt(hidden) = 11.3 and tied to the output: with std 0.2 the
        # token's own logit dominates and greedy decoding just repeats the last token
        embed_std=0.05,
        offset_norms="all", router=None),
    "gpt_oss": dict(
        config="GptOssConfig", model="GptOssForCausalLM", seed=1105, hub="save_pretrained",
        kw=dict(_BASE_KW, max_position_embeddings=131072, intermediate_size=128, num_hidden_layers=4, head_dim=32,
                num_local_experts=8, num_experts_per_tok=2, sliding_window=8, rms_norm_eps=1e-5,
                attention_bias=True, tie_word_embeddings=False,
                rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                                 "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096}),
        legacy={"rope_theta": 150000.0, "experts_per_token": 2, "initial_context_length": 4096, "swiglu_limit": 7.0,
                "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                 "truncate": False, "original_max_position_embeddings": 4096}},
        offset_norms=None, router="topk_softmax"),
    "glm4_moe": dict(
        config="Glm4MoeConfig", model="Glm4MoeForCausalLM", seed=2106, hub="save_pretrained",
        kw=dict(_BASE_KW, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=3, head_dim=32,
                partial_rotary_factor=0.5, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                attention_bias=True, use_qk_norm=True, rms_norm_eps=1e-5, n_routed_experts=8, n_shared_experts=1,
                num_experts_per_tok=2, n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
                first_k_dense_replace=1, num_nextn_predict_layers=0, tie_word_embeddings=False),
        legacy={"rope_theta": 1000000.0, "partial_rotary_factor": 0.5},
        offset_norms=None, router="sigmoid"),
    "deepseek_v3": dict(
        config="DeepseekV3Config", model="DeepseekV3ForCausalLM", seed=3107, hub="save_pretrained",
        kw=dict(_BASE_KW, num_key_value_heads=4, max_position_embeddings=163840, intermediate_size=256,
                moe_intermediate_size=64, num_hidden_layers=3, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=32,
                qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=16, num_experts_per_tok=4, n_group=4,
                topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                first_k_dense_replace=1, rms_norm_eps=1e-6, rope_interleave=True, attention_bias=False,
                num_nextn_predict_layers=0, tie_word_embeddings=False,
                rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0,
                                 "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                 "original_max_position_embeddings": 4096}),
        legacy={"rope_theta": 10000.0, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
                "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
                                 "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                 "original_max_position_embeddings": 4096}},
        offset_norms=None, router="sigmoid"),
}
NEW_QUANTS = [(4, 64), (8, 64)]

# mlx-lm quant_predicate overrides (recorded per module path in config "quantization")
_Q8_OVERRIDE = {"group_size": 64, "bits": 8}

# norm weights that mlx-lm's qwen3_next / qwen3_5 sanitize() stores as 1 + w
_MLX_PLUS1_SUFFIXES = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                       ".q_norm.weight", ".k_norm.weight")


def new_config(arch):
    spec = NEW_ARCHS[arch]
    cfg = getattr(transformers, spec["config"])(**copy.deepcopy(spec["kw"]))
    try:
        cfg._attn_implementation = "eager"
    except Exception as e:  # noqa: BLE001
        log("  (could not force eager attention:", e, ")")
    return cfg


def new_model2(arch, cfg):
    spec = NEW_ARCHS[arch]
    m = getattr(transformers, spec["model"])(copy.deepcopy(cfg))
    try:
        m.set_attn_implementation("eager")
    except Exception as e:  # noqa: BLE001
        log("  (set_attn_implementation failed:", e, ")")
    try:
        m.set_experts_implementation("eager")
    except Exception:  # noqa: BLE001
        pass  # dense models have no experts
    m.eval()
    if spec["kw"].get("tie_word_embeddings"):
        ensure_tied(m)
    return m


def _is_offset_norm(arch, name):
    mode = NEW_ARCHS[arch]["offset_norms"]
    if not name.endswith("norm.weight"):
        return False
    if mode == "all":
        return True
    if mode == "qwen":
        return not name.endswith("linear_attn.norm.weight")  # the gated RMSNorm uses plain w
    return False


def fill_random2(model, seed, arch):
    """Deterministic weights for the new archs (see tests/fixtures/README.md for the rules)."""
    g = torch.Generator().manual_seed(seed)
    router = NEW_ARCHS[arch]["router"]
    with torch.no_grad():
        items = list(model.named_parameters()) + [
            (n, b) for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")]
        for name, p in items:
            shape = p.shape
            if name.endswith("e_score_correction_bias"):
                v = 0.1 * torch.randn(shape, generator=g)
            elif name.endswith("A_log"):
                v = torch.log(1.0 + 15.0 * torch.rand(shape, generator=g))  # log(uniform(1, 16))
            elif name.endswith("dt_bias"):
                v = 0.5 * torch.randn(shape, generator=g)
            elif name.endswith("conv1d.weight"):
                v = 0.3 * torch.randn(shape, generator=g)
            elif name.endswith("sinks"):
                v = torch.randn(shape, generator=g)
            elif name.endswith("mlp.gate.weight") or name.endswith("mlp.router.weight"):
                # softmax routers: std 1 (logits far apart); sigmoid routers: std 0.2 so that
                # sigmoid(logit) does not saturate to exactly 1.0 (which would make ties)
                v = (0.2 if router == "sigmoid" else 1.0) * torch.randn(shape, generator=g)
            elif name.endswith("norm.weight"):
                if _is_offset_norm(arch, name):
                    v = 0.1 * torch.randn(shape, generator=g)  # applied as (1 + w)
                else:
                    v = 1.0 + 0.1 * torch.randn(shape, generator=g)
            elif name.endswith(".bias") or name.endswith("_bias"):
                v = 0.5 * torch.randn(shape, generator=g)
            elif "embed_tokens" in name or name.startswith("lm_head"):
                v = NEW_ARCHS[arch].get("embed_std", 0.2) * torch.randn(shape, generator=g)
            elif arch == "gpt_oss" and name.endswith("experts.gate_up_proj"):
                # wider, so that the clamps of gpt-oss's SwiGLU (gate <= 7, |up| <= 7) are hit
                v = 0.25 * torch.randn(shape, generator=g)
            else:
                v = 0.1 * torch.randn(shape, generator=g)
            p.copy_(v.to(p.dtype))


def finish_config(path, arch, dtype_name, quant=None, extra=None):
    """dtype keys, the 4.x-style keys hub configs carry (mlx-lm reads those), quantization."""
    with open(path) as f:
        c = json.load(f)
    c["dtype"] = dtype_name
    c["torch_dtype"] = dtype_name
    tc = c["text_config"] if isinstance(c.get("text_config"), dict) else c
    if tc is not c:
        tc["dtype"] = dtype_name
        tc["torch_dtype"] = dtype_name
    for k, v in NEW_ARCHS[arch]["legacy"].items():
        tc.setdefault(k, copy.deepcopy(v))
    if extra:
        c.update(extra)
    if quant is not None:
        c["quantization"] = copy.deepcopy(quant)
        c["quantization_config"] = copy.deepcopy(quant)
    c = dict(sorted(c.items()))
    with open(path, "w") as f:
        json.dump(c, f, indent=4)
        f.write("\n")


def raw_tensor(t):
    """(dtype string, shape, bytes) for write_safetensors; torch bf16/f32/uint8/int32(as U32)."""
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.uint8:
        return "U8", list(t.shape), t.numpy().tobytes()
    dt, raw = tensor_bytes(t)
    return dt, list(t.shape), raw


# ---------------------------------------------------------------------------- hub layout

def hub_state(arch, model, dtype):
    """The checkpoint (name -> tensor) for the -f32/-bf16 dirs when not written by save_pretrained."""
    spec = NEW_ARCHS[arch]
    tied = bool(spec["kw"].get("tie_word_embeddings"))
    out = {}
    for k, v in model.state_dict().items():
        if "rotary_emb" in k:
            continue
        if k == "lm_head.weight" and tied:
            continue
        if k.startswith("model."):
            k = "model.language_model." + k[len("model."):]
        out[k] = v.detach().clone().to(dtype if v.is_floating_point() else v.dtype)
    return out


def hub_to_model(arch, model, sd):
    """Checkpoint names -> the in-memory names of the reference model (float32)."""
    sd = {k: v.to(torch.float32) for k, v in sd.items()}
    if NEW_ARCHS[arch]["hub"] == "qwen3_5":
        sd = {("model." + k[len("model.language_model."):] if k.startswith("model.language_model.") else k): v
              for k, v in sd.items()}
    return to_model_keys(model, sd)


def load_model_state(model, sd, tied):
    res = model.load_state_dict(sd, strict=False)
    missing = [k for k in res.missing_keys if "rotary_emb" not in k]
    allowed = {"lm_head.weight"} if tied else set()
    bad = [k for k in missing if k not in allowed]
    if bad or res.unexpected_keys:
        raise RuntimeError(f"state mismatch: missing {bad} unexpected {res.unexpected_keys}")
    if tied:
        ensure_tied(model)


def read_st(path):
    """Our own safetensors reader (torch), so U8/U32 load whatever the safetensors version."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        data = f.read()
    h.pop("__metadata__", None)
    out = {}
    for k, e in h.items():
        a, b = e["data_offsets"]
        buf = bytearray(data[a:b])
        dt = e["dtype"]
        if dt == "F32":
            t = torch.frombuffer(buf, dtype=torch.float32)
        elif dt == "BF16":
            t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16)
        elif dt == "U8":
            t = torch.frombuffer(buf, dtype=torch.uint8)
        elif dt == "U32":
            t = torch.frombuffer(buf, dtype=torch.int32).to(torch.int64) & 0xFFFFFFFF
        else:
            raise TypeError(dt)
        out[k] = t.reshape(e["shape"]).clone()
    return out


# ---------------------------------------------------------------------------- MXFP4

FP4_VALUES = [+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4_quantize(w):
    """MXFP4 as the hub / transformers' integration define it (quantize_to_mxfp4 ->
    triton_kernels downcast_to_mxfp_torch, scale rounding ROUND_UP), along the last axis:
      per group of 32: s = amax/6 (float32), rounded UP to a power of two by its bit pattern
      ((bits + 0x7FFFFF) & 0x7F800000); E8M0 byte = biased exponent of s (0 if s == 0);
      q = x * (1/s); e2m1 code by the bit-level rounding of the reference (round to nearest,
      ties away from zero, subnormal 0.5 for [0.25, 0.75)), saturating at 6; sign bit 3.
      Two codes per byte, element 2j in the low nibble.
    Returns blocks uint8 [..., K/32, 16] and scales uint8 [..., K/32]."""
    K = w.shape[-1]
    assert K % 32 == 0
    x = w.to(torch.bfloat16).to(torch.float32).reshape(*w.shape[:-1], K // 32, 32)
    amax = x.abs().amax(dim=-1, keepdim=True)
    ds = amax / torch.full_like(amax, 6.0)  # a true float32 division (no reciprocal multiply)
    di = ds.view(torch.int32).to(torch.int64)
    di = (di + 0x007FFFFF) & 0x7F800000
    dsr = di.to(torch.int32).view(torch.float32)
    qs = torch.where(dsr == 0, torch.zeros_like(dsr), 1.0 / dsr)
    q = x * qs
    u = q.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    sign = (u >> 31) & 1
    exp = (u >> 23) & 0xFF
    mant = u & 0x7FFFFF
    shift = torch.clamp(126 - exp, min=0, max=63)
    mant = torch.where(exp < 127, (0x400000 | (mant >> 1)) >> shift, mant)
    e2 = torch.clamp(exp, min=126) - 126
    code = torch.clamp((((e2 << 2) | (mant >> 21)) + 1) >> 1, max=7) | (sign << 3)
    code = code.reshape(*w.shape[:-1], K // 32, 16, 2)
    blocks = (code[..., 0] | (code[..., 1] << 4)).to(torch.uint8)
    scales = ((di >> 23) & 0xFF).squeeze(-1).to(torch.uint8)
    return blocks, scales


def mxfp4_dequantize(blocks, scales):
    """float32 [..., K] = FP4[code] * 2^(scale - 127) (exact)."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    b = blocks.to(torch.int64)
    lo, hi = lut[b & 0x0F], lut[b >> 4]
    v = torch.stack([lo, hi], dim=-1).reshape(*blocks.shape[:-1], 32)
    v = torch.ldexp(v, (scales.to(torch.int64) - 127).unsqueeze(-1).to(torch.float32))
    return v.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


# ---------------------------------------------------------------------------- MLX layout

def _stack_per_expert(sd, stacked_name="switch_mlp"):
    """L.mlp.experts.E.P.weight -> L.mlp.<stacked_name>.P.weight [E, out, in]."""
    out, groups = {}, {}
    for k, v in sd.items():
        parts = k.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            i = parts.index("experts")
            key = ".".join(parts[:i]) + f".{stacked_name}." + ".".join(parts[i + 2:])
            groups.setdefault(key, {})[int(parts[i + 1])] = v
        else:
            out[k] = v
    for key, d in groups.items():
        out[key] = torch.stack([d[e] for e in range(len(d))])
    return out


def _plus_one(v):
    """mlx-lm sanitize: v + 1.0 in v's dtype (bf16: exact f32 sum, rounded to nearest even)."""
    return (v.to(torch.float32) + 1.0).to(v.dtype)


def mlx_sanitize(arch, sd, cfg):
    """bf16 hub checkpoint -> MLX tensor names/layout (before quantization), as mlx-lm's
    Model.sanitize() leaves them (plus our fixes where mlx-lm itself cannot convert a tiny model:
    see the notes per arch)."""
    sd = dict(sd)
    if arch in ("qwen3_5_moe", "qwen3_5"):
        new = {}
        for k, v in sd.items():
            if k.startswith("model.language_model."):
                k = "language_model.model." + k[len("model.language_model."):]
            elif not k.startswith("language_model."):
                k = "language_model." + k
            new[k] = v
        sd = new
        if arch == "qwen3_5_moe":
            for k in [k for k in sd if k.endswith("mlp.experts.gate_up_proj")]:
                gu = sd.pop(k)
                mid = gu.shape[-2] // 2
                pre = k[: -len("experts.gate_up_proj")]
                sd[pre + "switch_mlp.gate_proj.weight"] = gu[..., :mid, :].contiguous()
                sd[pre + "switch_mlp.up_proj.weight"] = gu[..., mid:, :].contiguous()
                sd[pre + "switch_mlp.down_proj.weight"] = sd.pop(pre + "experts.down_proj")
    if arch in ("qwen3_next", "glm4_moe", "deepseek_v3"):
        sd = _stack_per_expert(sd)
    if arch in ("qwen3_next", "qwen3_5_moe", "qwen3_5"):
        for k in list(sd):
            v = sd[k]
            if k.endswith("conv1d.weight") and v.shape[-1] != 1:
                sd[k] = v.transpose(1, 2).contiguous()  # (C, 1, K) -> (C, K, 1)
            if any(k.endswith(s) for s in _MLX_PLUS1_SUFFIXES) and v.dim() == 1:
                sd[k] = _plus_one(v)
    if arch == "gpt_oss":
        for k in [k for k in sd if k.endswith("mlp.experts.gate_up_proj")]:
            pre = k[: -len("gate_up_proj")]
            w = sd.pop(k).transpose(1, 2)  # [E, H, 2I] -> [E, 2I, H] (rows = outputs)
            sd[pre + "gate_proj.weight"] = w[:, 0::2, :].contiguous()
            sd[pre + "up_proj.weight"] = w[:, 1::2, :].contiguous()
            b = sd.pop(pre + "gate_up_proj_bias")
            sd[pre + "gate_proj.bias"] = b[:, 0::2].contiguous()
            sd[pre + "up_proj.bias"] = b[:, 1::2].contiguous()
            sd[pre + "down_proj.weight"] = sd.pop(pre + "down_proj").transpose(1, 2).contiguous()  # [E, H, I]
            sd[pre + "down_proj.bias"] = sd.pop(pre + "down_proj_bias")
    if arch == "deepseek_v3":
        H, dn, dv = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
        for k in [k for k in sd if k.endswith("self_attn.kv_b_proj.weight")]:
            pre = k[: -len("kv_b_proj.weight")]
            v = sd.pop(k).reshape(H, dn + dv, -1)
            sd[pre + "embed_q.weight"] = v[:, :dn, :].transpose(-1, -2).contiguous()  # [H, r, dn]
            sd[pre + "unembed_out.weight"] = v[:, dn:, :].contiguous()  # [H, dv, r]
    return sd


def mlx_quantizable(arch, name, t):
    """Module paths mlx-lm's quantize_model() would quantize (modules with to_quantized:
    Linear, Embedding, SwitchLinear, MultiLinear); the divisibility check is done by the caller."""
    if not name.endswith(".weight") or t.dim() < 2:
        return False
    if name.endswith("conv1d.weight"):
        return False  # nn.Conv1d: no to_quantized
    if arch in ("glm4_moe", "deepseek_v3") and name.endswith("mlp.gate.weight"):
        return False  # MoEGate holds a raw array
    return True


def mlx_override(arch, path):
    """mlx-lm quant_predicate (qwen3_next; qwen3_5 when num_experts > 0; gpt_oss)."""
    if arch in ("qwen3_next", "qwen3_5_moe") and (path.endswith("mlp.gate") or path.endswith("shared_expert_gate")):
        return dict(_Q8_OVERRIDE)
    if arch == "gpt_oss" and path.endswith("router"):
        return dict(_Q8_OVERRIDE)
    return None


def mlx_to_model(arch, sd, cfg):
    """Inverse of mlx_sanitize on dequantized float32 weights -> reference-model names."""
    sd = {k: v.to(torch.float32) for k, v in sd.items()}
    if arch in ("qwen3_5_moe", "qwen3_5"):
        new = {}
        for k, v in sd.items():
            if k.startswith("language_model."):
                k = k[len("language_model."):]
            new[k] = v
        sd = new
    if arch in ("qwen3_next", "qwen3_5_moe", "qwen3_5"):
        for k in list(sd):
            v = sd[k]
            if k.endswith("conv1d.weight"):
                sd[k] = v.transpose(1, 2).contiguous()
            if any(k.endswith(s) for s in _MLX_PLUS1_SUFFIXES) and v.dim() == 1:
                sd[k] = v - 1.0
    for k in [k for k in sd if k.endswith("switch_mlp.gate_proj.weight")]:
        pre = k[: -len("switch_mlp.gate_proj.weight")]
        sd[pre + "experts.gate_up_proj"] = torch.cat([sd.pop(k), sd.pop(pre + "switch_mlp.up_proj.weight")], dim=1)
        sd[pre + "experts.down_proj"] = sd.pop(pre + "switch_mlp.down_proj.weight")
    if arch == "gpt_oss":
        for k in [k for k in sd if k.endswith("mlp.experts.gate_proj.weight")]:
            pre = k[: -len("gate_proj.weight")]
            g, u = sd.pop(k), sd.pop(pre + "up_proj.weight")
            w = torch.empty(g.shape[0], 2 * g.shape[1], g.shape[2])
            w[:, 0::2], w[:, 1::2] = g, u
            sd[pre + "gate_up_proj"] = w.transpose(1, 2).contiguous()
            gb, ub = sd.pop(pre + "gate_proj.bias"), sd.pop(pre + "up_proj.bias")
            b = torch.empty(gb.shape[0], 2 * gb.shape[1])
            b[:, 0::2], b[:, 1::2] = gb, ub
            sd[pre + "gate_up_proj_bias"] = b
            sd[pre + "down_proj"] = sd.pop(pre + "down_proj.weight").transpose(1, 2).contiguous()
            sd[pre + "down_proj_bias"] = sd.pop(pre + "down_proj.bias")
    if arch == "deepseek_v3":
        for k in [k for k in sd if k.endswith("self_attn.embed_q.weight")]:
            pre = k[: -len("embed_q.weight")]
            wk = sd.pop(k).transpose(-1, -2)  # [H, dn, r]
            wv = sd.pop(pre + "unembed_out.weight")  # [H, dv, r]
            sd[pre + "kv_b_proj.weight"] = torch.cat([wk, wv], dim=1).reshape(-1, wk.shape[-1]).contiguous()
    return sd


def affine_quantize_nd(w, gs, bits):
    """mx.quantize along the last axis of a 2-D or stacked 3-D weight."""
    shp = list(w.shape)
    w2 = w.reshape(-1, shp[-1])
    codes, sc, bi = mlx_affine_quantize(w2, gs, bits)
    words = pack_codes(codes, bits)
    sc16, bi16 = sc.to(torch.bfloat16), bi.to(torch.bfloat16)
    assert torch.equal(unpack_codes(words, bits, shp[-1]), codes)
    deq = mlx_affine_dequantize(words, sc16, bi16, gs, bits).reshape(shp)
    words = words.reshape(shp[:-1] + [shp[-1] * bits // 32])
    return (("U32", list(words.shape), words.numpy().astype("<u4").tobytes()),
            raw_tensor(sc16.reshape(shp[:-1] + [shp[-1] // gs])),
            raw_tensor(bi16.reshape(shp[:-1] + [shp[-1] // gs])), deq)


def mlx_quantize_state(arch, msd, default, fine_grained, mxfp4_experts=None):
    """Quantize an MLX-layout state like mlx-lm's quantize_model(). default: {"group_size",
    "bits", "mode"} for every quantized module; fine_grained: record every quantized module in
    the config (mlx-lm does that when the model already had a "quantization" block, e.g. the
    MXFP4-Q8 gpt-oss conversion). mxfp4_experts: name -> (dtype, shape, raw) tensors already
    quantized (gpt_oss experts), with their dequantized float32 weights.
    Returns (tensors for write_safetensors, dequantized state, quantization dict, n quantized)."""
    gs_default = default["group_size"]
    quant = dict(default)
    tensors, deq, nq = {}, {}, 0
    pre_quant = set()
    if mxfp4_experts is not None:
        tensors.update(mxfp4_experts[0])
        deq.update(mxfp4_experts[1])
        pre_quant = set(mxfp4_experts[1])
    for k, v in msd.items():
        if k in pre_quant:
            continue
        path = k[: -len(".weight")] if k.endswith(".weight") else None
        if path and mlx_quantizable(arch, k, v) and v.shape[-1] % gs_default == 0:
            ov = mlx_override(arch, path)
            params = ov if ov is not None else {"group_size": gs_default, "bits": default["bits"]}
            if ov is not None:
                quant[path] = ov
            elif fine_grained:
                quant[path] = dict(default)
            w_raw, s_raw, b_raw, dq = affine_quantize_nd(v, params["group_size"], params["bits"])
            tensors[k] = w_raw
            tensors[path + ".scales"] = s_raw
            tensors[path + ".biases"] = b_raw
            deq[k] = dq
            nq += 1
        else:
            tensors[k] = raw_tensor(v)
            deq[k] = v.to(torch.float32)
    return tensors, deq, quant, nq


# ---------------------------------------------------------------------------- router diagnostics

@torch.no_grad()
def router_gaps(arch, model, ids):
    """Smallest gap, over every token of `ids` and every MoE layer, between the k-th and the
    (k+1)-th routing score (logits for softmax routers; sigmoid+bias for sigmoid routers, and
    the group-score gap for group-limited routing). Small gaps = fragile expert choices."""
    kind = NEW_ARCHS[arch]["router"]
    if kind is None:
        return None
    cfg = model.config
    k = cfg.num_experts_per_tok
    mods = [(n, m) for n, m in model.named_modules() if n.endswith(".mlp.gate") or n.endswith(".mlp.router")]
    seen = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, n=n: seen.__setitem__(n, args[0].detach().clone()))
             for n, m in mods]
    try:
        model(input_ids=torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    res = {"min_topk_gap": float("inf")}
    for n, m in mods:
        if n not in seen:
            continue
        x = seen[n].reshape(-1, cfg.hidden_size).float()
        logits = x @ m.weight.float().T
        if getattr(m, "bias", None) is not None and kind == "topk_softmax":
            logits = logits + m.bias.float()
        if kind in ("softmax", "topk_softmax"):
            s = torch.sort(logits, dim=-1, descending=True).values
        else:
            b = torch.sigmoid(logits) + m.e_score_correction_bias.float()
            G, tg = cfg.n_group, cfg.topk_group
            E = b.shape[-1]
            if G > 1:
                gsc = b.view(-1, G, E // G).topk(2, dim=-1).values.sum(-1)
                gss = torch.sort(gsc, dim=-1, descending=True).values
                res["min_group_gap"] = min(res.get("min_group_gap", float("inf")),
                                           float((gss[:, tg - 1] - gss[:, tg]).min()))
                keep = torch.zeros_like(gsc, dtype=torch.bool)
                keep.scatter_(1, torch.topk(gsc, tg, dim=-1).indices, True)
                keep = keep.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
                b = b.masked_fill(~keep, float("-inf"))
            s = torch.sort(b, dim=-1, descending=True).values
            res["min_selected_biased_score"] = min(res.get("min_selected_biased_score", float("inf")),
                                                   float(s[:, k - 1].min()))
        res["min_topk_gap"] = min(res["min_topk_gap"], float((s[:, k - 1] - s[:, k]).min()))
    return res


# ---------------------------------------------------------------------------- driver

def _ref_extra(arch, model, seq_ids, extra):
    e = dict(extra)
    e["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
    try:
        e["router_gaps"] = router_gaps(arch, model, seq_ids)
    except Exception as ex:  # noqa: BLE001
        e["router_gaps"] = f"failed: {type(ex).__name__}: {ex}"
    return e


def run_ref2(arch, d, model, model_type, dtype_name, extra):
    """run_reference() with the long prompt, plus router diagnostics over the whole sequence."""
    logits, greedy = run_reference(d, model, model_type, dtype_name, extra, PROMPT_IDS_LONG)
    with open(os.path.join(d, "reference.json")) as f:
        r = json.load(f)
    r.update(_ref_extra(arch, model, r["sequence_ids"], {}))
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(r, f, indent=1)
        f.write("\n")
    if r.get("router_gaps"):
        log(f"    router gaps: {r['router_gaps']}")
    return logits, greedy


def _layout(arch, kind):
    L = {
        "qwen3_next": "hub layout of Qwen/Qwen3-Next-80B-A3B (save_pretrained): per-expert "
                      "model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight; GDN in_proj_qkvz/in_proj_ba grouped "
                      "per key head; conv1d.weight (C,1,K); decoder/final/q/k norms stored as w (used as 1+w)",
        "qwen3_5_moe": "hub layout of Qwen/Qwen3.5-35B-A3B (own writer): model.language_model.*, fused "
                       "mlp.experts.gate_up_proj [E,2I,H] (gate rows first) and mlp.experts.down_proj [E,H,I] "
                       "without .weight, lm_head.weight top level, config text_config; norms stored as w (1+w)",
        "qwen3_5": "hub layout of dense Qwen3.5 (own writer): model.language_model.*, tied (no lm_head), "
                   "config text_config; norms stored as w (1+w)",
        "gemma3": "Gemma3ForCausalLM save_pretrained: model.*, tied (no lm_head); every norm stored as w (1+w)",
        "gpt_oss": "GptOssForCausalLM save_pretrained (transformers layout, like dequantized bf16 hub copies): "
                   "mlp.experts.gate_up_proj [E,H,2I] (x @ W, gate = even columns, up = odd), gate_up_proj_bias "
                   "[E,2I] interleaved the same way, down_proj [E,I,H], down_proj_bias [E,H]; "
                   "mlp.router.weight/bias; self_attn.sinks [nH]",
        "glm4_moe": "hub layout (save_pretrained): per-expert mlp.experts.E.*, mlp.gate.weight, "
                    "mlp.gate.e_score_correction_bias (F32 in every dir), mlp.shared_experts.*",
        "deepseek_v3": "hub layout (save_pretrained, no fp8): MLA q_a_proj/q_a_layernorm/q_b_proj/kv_a_proj_with_mqa/"
                       "kv_a_layernorm/kv_b_proj/o_proj, per-expert mlp.experts.E.*, mlp.gate.weight, "
                       "mlp.gate.e_score_correction_bias (F32 in every dir), mlp.shared_experts.*",
    }[arch]
    if kind == "mlx":
        M = {
            "qwen3_next": "mlx-lm layout: experts stacked as mlp.switch_mlp.{gate,up,down}_proj [E,...]; conv1d.weight "
                          "(C,K,1); decoder/final/q/k norms stored as 1+w (bf16); linear_attn.norm, A_log, dt_bias, "
                          "conv1d unquantized; mlp.gate and mlp.shared_expert_gate 8-bit per config overrides "
                          "(note: mlx-lm's own qwen3_next sanitize() would KeyError on a model with mlp_only_layers; "
                          "layer 1 here is dense and keeps mlp.{gate,up,down}_proj)",
            "qwen3_5_moe": "mlx-lm layout: language_model.model.* and language_model.lm_head; experts split from "
                           "gate_up_proj into language_model.model.layers.L.mlp.switch_mlp.{gate,up,down}_proj; conv1d "
                           "(C,K,1); norms stored as 1+w; mlp.gate / shared_expert_gate 8-bit overrides",
            "qwen3_5": "mlx-lm layout: language_model.model.*, tied (no lm_head: the quantized embedding is the output "
                       "projection); conv1d (C,K,1); norms stored as 1+w; no overrides (dense)",
            "gemma3": "mlx-lm layout: same names as the bf16 dir, tied (quantized embedding is the output projection); "
                      "norms unchanged (still w, used as 1+w)",
            "gpt_oss": "mlx-lm layout of a plain affine conversion: mlp.experts.{gate,up}_proj.{weight,scales,biases} "
                       "[E,I,...] de-interleaved from gate_up (rows = outputs), .bias [E,I]; mlp.experts.down_proj "
                       "[E,H,...], .bias [E,H]; router 8-bit per config override; sinks, norms and all .bias bf16",
            "glm4_moe": "mlx-lm layout: experts stacked as mlp.switch_mlp.*; router mlp.gate.weight bf16 unquantized "
                        "(MoEGate raw array), e_score_correction_bias F32; q/k/v .bias bf16 next to .biases",
            "deepseek_v3": "mlx-lm layout: experts stacked as mlp.switch_mlp.*; kv_b_proj replaced by "
                           "self_attn.embed_q.weight [H, kv_lora_rank, qk_nope] (= W_UK^T) and "
                           "self_attn.unembed_out.weight [H, v_head, kv_lora_rank] (= W_UV); router bf16, "
                           "e_score_correction_bias F32; modules whose input dim is not a multiple of 64 "
                           "(q_b_proj in=48, embed_q in=32, unembed_out in=32) stay bf16",
        }[arch]
        return M
    return L


def make_new_base(out, arch):
    spec = NEW_ARCHS[arch]
    seed = spec["seed"]
    tied = bool(spec["kw"].get("tie_word_embeddings"))
    cfg = new_config(arch)
    torch.manual_seed(seed)
    m = new_model2(arch, cfg)
    fill_random2(m, seed, arch)
    model_type = m.config.model_type
    wrapped = spec["hub"] == "qwen3_5"
    top_type = None
    if wrapped:
        wcfg = getattr(transformers, spec["wrapper_config"])(
            text_config=cfg.to_dict(), vision_config=dict(_Q35_VISION), tie_word_embeddings=tied)
        top_type = wcfg.model_type
    base_extra = {"seed": seed, "layout": _layout(arch, "hub")}

    def write_dir(d, dtype):
        os.makedirs(d, exist_ok=True)
        dtype_name = "float32" if dtype == torch.float32 else "bfloat16"
        if wrapped:
            st = hub_state(arch, m, dtype)
            write_safetensors(os.path.join(d, "model.safetensors"), {k: raw_tensor(v) for k, v in st.items()},
                              {"format": "pt"})
            c = wcfg.to_dict()
            c["architectures"] = [spec["wrapper_model"]]
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(c, f)
            gen = transformers.GenerationConfig(bos_token_id=1, eos_token_id=2)
            gen.save_pretrained(d)
        else:
            mm = copy.deepcopy(m)
            if dtype != torch.float32:
                keep = {n: b.detach().clone() for n, b in mm.named_buffers() if n.endswith("e_score_correction_bias")}
                mm = mm.to(dtype)
                for n, b in keep.items():  # the hub keeps the correction bias in float32
                    mod = mm.get_submodule(n.rsplit(".", 1)[0])
                    setattr(mod, "e_score_correction_bias", b)
            mm.save_pretrained(d)
        finish_config(os.path.join(d, "config.json"), arch, dtype_name)
        st = read_st(os.path.join(d, "model.safetensors"))
        return st

    # ---- f32
    d32 = os.path.join(out, f"{arch}-f32")
    st32 = write_dir(d32, torch.float32)
    for k, v in st32.items():
        assert v.dtype == torch.float32, k
    ref32 = new_model2(arch, cfg)
    load_model_state(ref32, hub_to_model(arch, ref32, st32), tied)
    logits32, _ = run_ref2(arch, d32, ref32, top_type or model_type, "float32", base_extra)
    if wrapped:
        _wrapper_check(arch, d32, logits32)

    # ---- bf16
    d16 = os.path.join(out, f"{arch}-bf16")
    st16 = write_dir(d16, torch.bfloat16)
    for k, v in st16.items():
        assert v.dtype == torch.bfloat16 or k.endswith("e_score_correction_bias"), k
    ref16 = new_model2(arch, cfg)
    load_model_state(ref16, hub_to_model(arch, ref16, st16), tied)
    logits, greedy = run_ref2(arch, d16, ref16, top_type or model_type, "bfloat16", base_extra)
    nat = new_model2(arch, cfg).to(torch.bfloat16)
    nsd = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in hub_to_model(arch, nat, st16).items()}
    load_model_state(nat, nsd, tied)
    with torch.no_grad():
        nl = nat(input_ids=torch.tensor([PROMPT_IDS_LONG])).logits[0].float()
    diff = float((nl - logits).abs().max())
    nat_greedy = reference(nat, PROMPT_IDS_LONG)[1]
    with open(os.path.join(d16, "reference.json")) as f:
        r = json.load(f)
    r["bf16_native_max_abs_diff"] = diff
    r["bf16_native_greedy_ids"] = nat_greedy
    r["bf16_native_greedy_agrees"] = nat_greedy == greedy
    with open(os.path.join(d16, "reference.json"), "w") as f:
        json.dump(r, f, indent=1)
        f.write("\n")
    log(f"  {arch}-bf16 native vs upcast: max abs diff {diff:.4f}, greedy agrees {nat_greedy == greedy}")
    if arch == "gemma3":
        try:
            make_gemma3_mm(out, cfg, st16, logits)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            log("  gemma3_mm-bf16 FAILED")
    return cfg, tied, top_type or model_type, st16, d16


def _wrapper_check(arch, d, logits):
    """Load the hub-layout dir with the real wrapper class (ForConditionalGeneration) and compare."""
    spec = NEW_ARCHS[arch]
    try:
        wm = getattr(transformers, spec["wrapper_model"]).from_pretrained(d, dtype=torch.float32)
        try:
            wm.set_attn_implementation("eager")
            wm.set_experts_implementation("eager")
        except Exception:  # noqa: BLE001
            pass
        wm.eval()
        with torch.no_grad():
            wl = wm(input_ids=torch.tensor([PROMPT_IDS_LONG])).logits[0].float()
        res = float((wl - logits).abs().max())
    except Exception as e:  # noqa: BLE001
        res = f"failed: {type(e).__name__}: {e}"
    log(f"  {os.path.basename(d)}: {spec['wrapper_model']}.from_pretrained logits vs reference: {res}")
    with open(os.path.join(d, "reference.json")) as f:
        r = json.load(f)
    r["wrapper_from_pretrained_max_abs_diff"] = res
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(r, f, indent=1)
        f.write("\n")


def make_gemma3_mm(out, cfg, st16, logits16):
    """gemma3_mm-bf16: the gemma3-bf16 weights inside Gemma3ForConditionalGeneration (tiny random
    vision tower), saved by save_pretrained: language_model.model.*, vision_tower.*,
    multi_modal_projector.*, config model_type gemma3 with text_config. Same logits as gemma3-bf16."""
    d = os.path.join(out, "gemma3_mm-bf16")
    torch.manual_seed(NEW_ARCHS["gemma3"]["seed"] + 50)
    wcfg = transformers.Gemma3Config(text_config=cfg.to_dict(), vision_config=dict(_G3_VISION), mm_tokens_per_image=4,
                                     image_token_index=300, boi_token_index=301, eoi_token_index=302)
    wm = transformers.Gemma3ForConditionalGeneration(wcfg)
    sd = {"model.language_model." + k[len("model."):]: v.to(torch.float32) for k, v in st16.items()}
    res = wm.load_state_dict(sd, strict=False)
    assert not res.unexpected_keys, res.unexpected_keys
    wm = wm.to(torch.bfloat16)
    wm.save_pretrained(d)
    finish_config(os.path.join(d, "config.json"), "gemma3", "bfloat16")
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    for k in NEW_ARCHS["gemma3"]["legacy"]:  # legacy keys belong in text_config only
        if k in c and k in c.get("text_config", {}):
            c.pop(k)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=4)
        f.write("\n")
    for k in ("reference_logits.f32", "reference_sequence_logits.f32"):
        with open(os.path.join(out, "gemma3-bf16", k), "rb") as f:
            data = f.read()
        with open(os.path.join(d, k), "wb") as f:
            f.write(data)
    with open(os.path.join(out, "gemma3-bf16", "reference.json")) as f:
        r = json.load(f)
    r["model_type"] = "gemma3"
    r["base"] = "gemma3-bf16"
    r["layout"] = ("Gemma3ForConditionalGeneration save_pretrained (hub layout of google/gemma-3-4b-it): "
                   "language_model.model.* (text weights identical to gemma3-bf16), vision_tower.* and "
                   "multi_modal_projector.* (tiny random SigLIP, to be skipped), config model_type gemma3 with "
                   "text_config; reference files copied from gemma3-bf16")
    try:
        lm = transformers.Gemma3ForConditionalGeneration.from_pretrained(d, dtype=torch.float32)
        lm.set_attn_implementation("eager")
        lm.eval()
        with torch.no_grad():
            wl = lm(input_ids=torch.tensor([PROMPT_IDS_LONG])).logits[0].float()
        chk = float((wl - logits16).abs().max())
    except Exception as e:  # noqa: BLE001
        chk = f"failed: {type(e).__name__}: {e}"
    r["wrapper_from_pretrained_max_abs_diff"] = chk
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(r, f, indent=1)
        f.write("\n")
    log(f"  gemma3_mm-bf16: Gemma3ForConditionalGeneration.from_pretrained logits vs gemma3-bf16: {chk}")


def _copy_gen(d16, d):
    gpath = os.path.join(d16, "generation_config.json")
    if os.path.exists(gpath):
        with open(gpath) as f:
            gtxt = f.read()
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            f.write(gtxt)


def _config_from(d16, d, arch, quant, extra=None, drop=()):
    with open(os.path.join(d16, "config.json")) as f:
        c = json.load(f)
    for k in drop:
        c.pop(k, None)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)
    finish_config(os.path.join(d, "config.json"), arch, "bfloat16", quant, extra)


def make_new_quant(out, arch, bits, gs, cfg, tied, model_type, st16, d16):
    d = os.path.join(out, f"{arch}-q{bits}g{gs}")
    os.makedirs(d, exist_ok=True)
    msd = mlx_sanitize(arch, st16, cfg)
    tensors, deq, quant, nq = mlx_quantize_state(arch, msd, {"group_size": gs, "bits": bits, "mode": "affine"},
                                                 fine_grained=False)
    write_safetensors(os.path.join(d, "model.safetensors"), tensors, {"format": "mlx"})
    _config_from(d16, d, arch, quant)
    _copy_gen(d16, d)
    ref = new_model2(arch, cfg)
    load_model_state(ref, to_model_keys(ref, mlx_to_model(arch, deq, cfg)), tied)
    run_ref2(arch, d, ref, model_type, f"q{bits}g{gs}",
             {"quantization": quant, "quantized_tensors": nq, "base": os.path.basename(d16),
              "layout": _layout(arch, "mlx"),
              "reference_weights": "float32 scale*q + bias from the stored bf16 scales/biases "
                                   "(norms stored as 1+w are used as stored)"})


def make_gpt_oss_mxfp4(out, cfg, st16, d16):
    """gpt_oss-mxfp4 (hub layout of openai/gpt-oss-*) and gpt_oss-mlx-mxfp4q8 (mlx-community
    gpt-oss-*-MXFP4-Q8 layout), experts MXFP4-quantized from the gpt_oss-bf16 weights."""
    arch = "gpt_oss"
    tied = False
    hub, deq = {}, {}
    experts = {}
    for k, v in st16.items():
        if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj"):
            w = v.transpose(1, 2).contiguous()  # [E, out, in]
            blocks, scales = mxfp4_quantize(w)
            hub[k + "_blocks"] = raw_tensor(blocks)
            hub[k + "_scales"] = raw_tensor(scales)
            dq = mxfp4_dequantize(blocks, scales)  # [E, out, in]
            experts[k] = (blocks, scales, dq)
            deq[k] = dq.transpose(1, 2).contiguous()
        else:
            hub[k] = raw_tensor(v)
            deq[k] = v.to(torch.float32)
    # cross-check against transformers' own MXFP4 dequantizer
    tchk = None
    try:
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors
        tchk = 0.0
        for k, (blocks, scales, dq) in experts.items():
            t = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, in, out]
            tchk = max(tchk, float((t - dq.transpose(1, 2)).abs().max()))
    except Exception as e:  # noqa: BLE001
        tchk = f"failed: {type(e).__name__}: {e}"
    log(f"  mxfp4: transformers convert_moe_packed_tensors vs our dequant: {tchk}")
    d = os.path.join(out, "gpt_oss-mxfp4")
    os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(d, "model.safetensors"), hub, {"format": "pt"})
    qcfg = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                 "model.embed_tokens", "lm_head"]}
    _config_from(d16, d, arch, None, {"quantization_config": qcfg})
    _copy_gen(d16, d)
    ref = new_model2(arch, cfg)
    load_model_state(ref, deq, tied)
    run_ref2(arch, d, ref, "gpt_oss", "mxfp4",
             {"hf_quantization_config": qcfg, "base": "gpt_oss-bf16", "layout": (
                 "hub MXFP4 layout (openai/gpt-oss-*): model.layers.L.mlp.experts.gate_up_proj_blocks U8 "
                 "[E, 2I, H/32, 16] and _scales U8 [E, 2I, H/32] (rows = output features: even rows gate, odd rows up), "
                 "down_proj_blocks U8 [E, H, I/32, 16], down_proj_scales U8 [E, H, I/32]; gate_up_proj_bias/"
                 "down_proj_bias BF16; everything else BF16 as in gpt_oss-bf16; config quantization_config "
                 "{quant_method: mxfp4}"),
              "mxfp4_quantizer": "triton_kernels downcast_to_mxfp_torch semantics (scale = 2^ceil(log2(amax/6)) via "
                                 "bit rounding, e2m1 round-to-nearest ties away), from the gpt_oss-bf16 weights",
              "reference_weights": "float32 FP4[code] * 2^(scale-127) for the experts, bf16 upcast for the rest",
              "transformers_dequant_max_abs_diff": tchk})
    # optional: transformers' own loader on the hub-layout dir (dequantizes MXFP4 without kernels)
    try:
        qm = transformers.GptOssForCausalLM.from_pretrained(
            d, dtype=torch.float32, quantization_config=transformers.Mxfp4Config(dequantize=True))
        qm.set_attn_implementation("eager")
        try:
            qm.set_experts_implementation("eager")
        except Exception:  # noqa: BLE001
            pass
        qm = qm.float().eval()
        with torch.no_grad():
            ql = qm(input_ids=torch.tensor([PROMPT_IDS_LONG])).logits[0].float()
        rl = np.fromfile(os.path.join(d, "reference_logits.f32"), "<f4").reshape(len(PROMPT_IDS_LONG), VOCAB)
        fchk = float((ql - torch.from_numpy(rl)).abs().max())
    except Exception as e:  # noqa: BLE001
        fchk = f"failed: {type(e).__name__}: {e}"
    log(f"  gpt_oss-mxfp4: GptOssForCausalLM.from_pretrained(dequantize) logits vs reference: {fchk}")
    with open(os.path.join(d, "reference.json")) as f:
        r = json.load(f)
    r["from_pretrained_max_abs_diff"] = fchk
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(r, f, indent=1)
        f.write("\n")

    # ---- MLX MXFP4-Q8
    d = os.path.join(out, "gpt_oss-mlx-mxfp4q8")
    os.makedirs(d, exist_ok=True)
    msd = mlx_sanitize(arch, st16, cfg)
    pre_t, pre_d = {}, {}
    for k, (blocks, scales, dq) in experts.items():
        base = k[: -len("gate_up_proj")] if k.endswith("gate_up_proj") else k[: -len("down_proj")]
        if k.endswith("gate_up_proj"):
            parts = [("gate_proj", slice(0, None, 2)), ("up_proj", slice(1, None, 2))]
        else:
            parts = [("down_proj", slice(None))]
        for name, sl in parts:
            bl = blocks[:, sl].contiguous()  # [E, out, in/32, 16] -> uint32 view [E, out, in/8]
            E, O, G, _ = bl.shape
            pre_t[base + name + ".weight"] = ("U32", [E, O, G * 4], bl.numpy().tobytes())
            pre_t[base + name + ".scales"] = raw_tensor(scales[:, sl].contiguous())
            pre_d[base + name + ".weight"] = dq[:, sl].contiguous()
    tensors, deq2, quant, nq = mlx_quantize_state(
        arch, msd, {"group_size": 64, "bits": 8, "mode": "affine"}, fine_grained=True, mxfp4_experts=(pre_t, pre_d))
    quant = dict(quant)
    top = {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    quant.update(top)  # experts are covered by the top level entry; every other module has its own
    quant = dict(list(top.items()) + [(k, v) for k, v in quant.items() if k not in top])
    write_safetensors(os.path.join(d, "model.safetensors"), tensors, {"format": "mlx"})
    _config_from(d16, d, arch, quant)
    _copy_gen(d16, d)
    ref = new_model2(arch, cfg)
    load_model_state(ref, mlx_to_model(arch, deq2, cfg), tied)
    run_ref2(arch, d, ref, "gpt_oss", "mlx-mxfp4q8",
             {"quantization": quant, "quantized_tensors": nq + len(pre_d), "base": "gpt_oss-mxfp4",
              "layout": ("mlx-community gpt-oss-*-MXFP4-Q8 layout: experts mxfp4 as mlx-lm gpt_oss sanitize() makes "
                         "them from the hub blocks: mlp.experts.{gate,up}_proj.weight U32 [E, I, H/8] (= even/odd rows "
                         "of gate_up_proj_blocks, bytes viewed as little-endian uint32), .scales U8 [E, I, H/32], no "
                         ".biases, .bias BF16 [E, I]; mlp.experts.down_proj.weight U32 [E, H, I/8], .scales U8 "
                         "[E, H, I/32], .bias BF16 [E, H]; embed_tokens, lm_head, self_attn.{q,k,v,o}_proj: affine "
                         "8-bit g64 (per-module entries with mode affine); mlp.router: affine 8-bit g64 (entry "
                         "without mode, from gpt_oss quant_predicate); top-level quantization {32, 4, mxfp4} "
                         "applies to the experts only"),
              "reference_weights": "experts as gpt_oss-mxfp4 (same bytes); others float32 scale*q + bias"})


def make_new_arch(out, arch, failures):
    log(f"== {arch}")
    try:
        cfg, tied, model_type, st16, d16 = make_new_base(out, arch)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        failures.append(arch)
        return
    for bits, gs in NEW_QUANTS:
        try:
            make_new_quant(out, arch, bits, gs, cfg, tied, model_type, st16, d16)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            failures.append(f"{arch}-q{bits}g{gs}")
    if arch == "gpt_oss":
        try:
            make_gpt_oss_mxfp4(out, cfg, st16, d16)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            failures.append("gpt_oss-mxfp4")


def candidate_score(root, arch):
    """Seed search: rank a candidate set of dirs of one arch. Prefer no greedy margin below
    2e-3 in the first 12 steps of any dir, a non-degenerate f32 greedy continuation, then the
    largest smallest router gap, then the largest smallest margin."""
    early, allm, rg, distinct = float("inf"), float("inf"), float("inf"), 0
    for n in sorted(os.listdir(root)):
        p = os.path.join(root, n, "reference.json")
        if not os.path.exists(p):
            continue
        with open(p) as f:
            r = json.load(f)
        early = min(early, min(r["greedy_margins"][:12]))
        allm = min(allm, min(r["greedy_margins"]))
        g = r.get("router_gaps")
        if isinstance(g, dict):
            rg = min([rg] + [v for k, v in g.items() if k != "min_selected_biased_score"])
        if n.endswith("-f32"):
            distinct = len(set(r["greedy_ids"]))
    return (early >= 2e-3, distinct >= 6, min(rg, 0.02), min(allm, 0.02)), dict(
        early_min_margin=early, min_margin=allm, min_router_gap=rg, distinct_greedy_f32=distinct)


def pick_candidates(cand_root, out, archs):
    """cand_root/<arch>_<seed>/ hold full candidate sets made with --seed; move the best set
    of each arch into out/ (then set that seed in NEW_ARCHS so a re-run reproduces it)."""
    import shutil
    os.makedirs(out, exist_ok=True)
    for arch in archs:
        cands = []
        for c in sorted(os.listdir(cand_root)):
            if c.rsplit("_", 1)[0] == arch and os.path.isdir(os.path.join(cand_root, c)):
                key, info = candidate_score(os.path.join(cand_root, c), arch)
                cands.append((key, c, info))
                log(f"candidate {c}: {info} key {key}")
        if not cands:
            log(f"no candidates for {arch}")
            continue
        best = max(cands)[1]
        log(f"PICKED {best}")
        for n in os.listdir(os.path.join(cand_root, best)):
            src = os.path.join(cand_root, best, n)
            if os.path.isdir(src):
                shutil.rmtree(os.path.join(out, n), ignore_errors=True)
                shutil.move(src, os.path.join(out, n))


def pack_dirs(src, dst, names, limit=15 << 20, prefix="fx"):
    """Tar the given fixture dirs of `src` into gzip files of at most ~limit bytes each in dst."""
    import tarfile
    os.makedirs(dst, exist_ok=True)
    sizes = []
    for n in sorted(names):
        p = os.path.join(src, n)
        sizes.append((n, sum(os.path.getsize(os.path.join(p, f)) for f in os.listdir(p))))
    groups, cur, tot = [], [], 0
    for n, s in sizes:
        if cur and tot + s > limit * 1.05:
            groups.append(cur)
            cur, tot = [], 0
        cur.append(n)
        tot += s
    if cur:
        groups.append(cur)
    for i, g in enumerate(groups):
        with tarfile.open(os.path.join(dst, f"{prefix}{i}.tgz"), "w:gz") as t:
            for n in g:
                t.add(os.path.join(src, n), arcname=n)
        log(f"packed {prefix}{i}.tgz: {g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (gets one subfolder per fixture)")
    ap.add_argument("--only", default=None, help="comma list of archs (debug)")
    ap.add_argument("--archs", default=None,
                    help="comma list of the new archs (" + ",".join(NEW_ARCHS) + ") or 'new' for all of them; "
                         "makes only those (no quant_vectors, none of the older archs)")
    ap.add_argument("--pack", default=None, metavar="SRC",
                    help="instead of generating: tar the dirs of --archs found in SRC into --out (<=15 MB each)")
    ap.add_argument("--seed", type=int, default=None, help="override the seed of the --archs (seed search)")
    ap.add_argument("--pick", default=None, metavar="CANDROOT",
                    help="instead of generating: move the best candidate set CANDROOT/<arch>_<seed>/ of each of "
                         "--archs into --out")
    args = ap.parse_args()
    if args.archs:
        new_archs = list(NEW_ARCHS) if args.archs == "new" else args.archs.split(",")
        for a in new_archs:
            if a not in NEW_ARCHS:
                ap.error(f"unknown new arch {a}")
            if args.seed is not None:
                NEW_ARCHS[a]["seed"] = args.seed
        if args.pick:
            pick_candidates(args.pick, args.out, new_archs)
            return
        if args.pack:
            names = [n for n in os.listdir(args.pack)
                     if os.path.isdir(os.path.join(args.pack, n)) and n.split("-")[0] in
                     set(new_archs) | {a + "_mm" for a in new_archs}]
            pack_dirs(args.pack, args.out, names, prefix="fx_" + "_".join(sorted(new_archs))[:40] + "_")
            return
        torch.set_num_threads(1)
        torch.set_grad_enabled(False)
        os.makedirs(args.out, exist_ok=True)
        log(f"transformers {transformers.__version__} torch {torch.__version__} python {sys.version.split()[0]}")
        log(f"long prompt ({len(PROMPT_IDS_LONG)} ids): {PROMPT_IDS_LONG}")
        failures = []
        for a in new_archs:
            make_new_arch(args.out, a, failures)
        with open(os.path.join(args.out, "VERSIONS.json"), "w") as f:
            json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                       "numpy": np.__version__, "python": sys.version.split()[0]}, f, indent=1)
            f.write("\n")
        if failures:
            log("FAILED:", failures)
            sys.exit(1)
        log("done")
        return
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
    except Exception:  # noqa: BLE001
        pass
    os.makedirs(args.out, exist_ok=True)
    log(f"transformers {transformers.__version__} torch {torch.__version__} python {sys.version.split()[0]}")
    failures = []
    try:
        make_quant_vectors(args.out)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        failures.append("quant_vectors")
    archs = args.only.split(",") if args.only else list(ARCHS)
    for arch in archs:
        log(f"== {arch}")
        try:
            cfg, tied, model_type, st16, d16 = make_base(args.out, arch)
            if tied and "lm_head.weight" in st16:
                log("  note: save_pretrained stored lm_head.weight for a tied model")
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            failures.append(arch)
            continue
        for a, bits, gs in QUANT_DIRS:
            if a == arch:
                try:
                    make_quant(args.out, arch, bits, gs, cfg, tied, model_type, st16, d16)
                except Exception:  # noqa: BLE001
                    traceback.print_exc()
                    failures.append(f"{arch}-q{bits}g{gs}")
    with open(os.path.join(args.out, "VERSIONS.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                   "numpy": np.__version__, "python": sys.version.split()[0]}, f, indent=1)
        f.write("\n")
    if failures:
        log("FAILED:", failures)
        sys.exit(1)
    log("done")


if __name__ == "__main__":
    main()
