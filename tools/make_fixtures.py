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
def reference(model):
    """Prompt logits [T, V] and manual greedy decode (full recompute, argmax)."""
    ids = torch.tensor([PROMPT_IDS], dtype=torch.long)
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
def generate_check(model):
    """transformers' generate(do_sample=False), eos disabled, as a cross-check."""
    ids = torch.tensor([PROMPT_IDS], dtype=torch.long)
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
        return [int(x) for x in out[0, len(PROMPT_IDS):]], None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def write_reference(d, model_type, dtype_name, logits, greedy, margins, seq_logits, extra):
    logits.numpy().astype("<f4").tofile(os.path.join(d, "reference_logits.f32"))
    seq_logits.numpy().astype("<f4").tofile(os.path.join(d, "reference_sequence_logits.f32"))
    ref = {
        "model_type": model_type,
        "dtype": dtype_name,
        "prompt_ids": PROMPT_IDS,
        "logits_file": "reference_logits.f32",
        "logits_shape": list(logits.shape),
        "greedy_ids": greedy,
        "greedy_margins": margins,
        "bf16_native_max_abs_diff": None,
        "sequence_ids": PROMPT_IDS + greedy,
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


def run_reference(d, model, model_type, dtype_name, extra):
    logits, greedy, margins, seq_logits = reference(model)
    gen, err = generate_check(model)
    extra = dict(extra)
    extra["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    if gen is None:
        extra["generate_check"] = err
    else:
        extra["generate_ids"] = gen
        extra["generate_agrees"] = gen == greedy
    write_reference(d, model_type, dtype_name, logits, greedy, margins, seq_logits, extra)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (gets one subfolder per fixture)")
    ap.add_argument("--only", default=None, help="comma list of archs (debug)")
    args = ap.parse_args()
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
