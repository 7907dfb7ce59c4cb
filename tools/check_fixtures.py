#!/usr/bin/env python3
"""Sanity-check tests/fixtures/ (made by tools/make_fixtures.py) with numpy only.

    /usr/bin/python3 tools/check_fixtures.py [tests/fixtures]

Checks, for every model dir: reference.json fields, the size of
reference_logits.f32 against logits_shape, that the first greedy token is the
argmax of the last prompt position's logits (with its margin), safetensors headers
(dtypes, shapes, MLX names for quantized dirs).  For quantized dirs it re-quantizes
the <arch>-bf16 weights with a second, numpy implementation of MLX's affine
quantization and requires the packed codes, scales and biases to match the stored
ones bit for bit; for quant_vectors it does the same and re-checks dequant.f32.
Exits non-zero on any failure.
"""

import json
import os
import struct
import sys

import numpy as np

F32 = np.float32


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        raw = data[a:b]
        dt = h["dtype"]
        if dt == "F32":
            arr = np.frombuffer(raw, "<f4")
        elif dt == "BF16":
            arr = bf16_to_f32(np.frombuffer(raw, "<u2"))
        elif dt == "U32":
            arr = np.frombuffer(raw, "<u4")
        elif dt == "U8":
            arr = np.frombuffer(raw, "u1")
        else:
            raise ValueError(dt)
        out[name] = (dt, arr.reshape(h["shape"]), raw)
    return meta, out


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """Round to nearest even, like torch / MLX (no NaNs here)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounding = ((u >> 16) & 1) + 0x7FFF
    return ((u + rounding) >> 16).astype(np.uint16)


def np_quantize(w, gs, bits):
    """Second implementation of MLX affine quantize (mlx/backend/cpu/quantized.cpp)."""
    w = np.asarray(w, dtype=F32)
    R, C = w.shape
    g = w.reshape(R, C // gs, gs)
    wmax = g.max(axis=-1, keepdims=True)
    wmin = g.min(axis=-1, keepdims=True)
    nb = F32((1 << bits) - 1)
    eps = F32(1e-7)
    mask = np.abs(wmin) > np.abs(wmax)
    scale = np.maximum((wmax - wmin) / nb, eps).astype(F32)
    scale = np.where(mask, scale, -scale).astype(F32)
    edge = np.where(mask, wmin, wmax).astype(F32)
    q0 = np.rint(edge / scale).astype(F32)
    nz = q0 != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(nz, edge / q0, scale).astype(F32)
    bias = np.where(nz, edge, F32(0)).astype(F32)
    q = np.rint((g - bias) / scale).astype(F32)
    q = np.minimum(np.maximum(q, F32(0)), nb)
    codes = q.astype(np.uint64).reshape(R, C)
    # pack: one LSB-first bit stream per row
    words = np.zeros((R, C * bits // 32), dtype=np.uint64)
    for j in range(C):
        for bit in range(bits):
            k = j * bits + bit
            words[:, k // 32] |= ((codes[:, j] >> np.uint64(bit)) & np.uint64(1)) << np.uint64(k % 32)
    return codes, words.astype(np.uint32), scale.reshape(R, -1), bias.reshape(R, -1)


def np_unpack(words, bits, cols):
    R = words.shape[0]
    codes = np.zeros((R, cols), dtype=np.uint32)
    w = words.astype(np.uint64)
    for j in range(cols):
        v = np.zeros(R, dtype=np.uint64)
        for bit in range(bits):
            k = j * bits + bit
            v |= ((w[:, k // 32] >> np.uint64(k % 32)) & np.uint64(1)) << np.uint64(bit)
        codes[:, j] = v
    return codes


FAIL = []


def check(cond, msg):
    if not cond:
        FAIL.append(msg)
        print("FAIL:", msg)


def check_model_dir(root, name):
    d = os.path.join(root, name)
    ref = json.load(open(os.path.join(d, "reference.json")))
    for k in ("model_type", "dtype", "prompt_ids", "logits_shape", "greedy_ids", "greedy_margins",
              "bf16_native_max_abs_diff", "transformers_version"):
        check(k in ref, f"{name}: reference.json lacks {k}")
    T, V = ref["logits_shape"]
    check(T == len(ref["prompt_ids"]), f"{name}: T != len(prompt)")
    lg = np.fromfile(os.path.join(d, "reference_logits.f32"), "<f4")
    check(lg.size == T * V, f"{name}: logits size {lg.size} != {T}*{V}")
    lg = lg.reshape(T, V)
    check(np.isfinite(lg).all(), f"{name}: non-finite logits")
    last = lg[-1]
    am = int(np.argmax(last))
    srt = np.sort(last)
    margin0 = float(srt[-1] - srt[-2])
    check(am == ref["greedy_ids"][0], f"{name}: greedy[0]={ref['greedy_ids'][0]} argmax={am}")
    check(abs(margin0 - ref["greedy_margins"][0]) < 1e-3,
          f"{name}: margin0 {margin0} vs {ref['greedy_margins'][0]}")
    check(len(ref["greedy_ids"]) == 24 and len(ref["greedy_margins"]) == 24, f"{name}: not 24 steps")
    check(all(0 <= t < V for t in ref["greedy_ids"]), f"{name}: greedy id out of range")
    S = len(ref["sequence_ids"])
    check(ref["sequence_ids"] == ref["prompt_ids"] + ref["greedy_ids"], f"{name}: sequence_ids")
    check(ref["sequence_logits_shape"] == [S, V], f"{name}: sequence_logits_shape")
    sl = np.fromfile(os.path.join(d, ref["sequence_logits_file"]), "<f4")
    check(sl.size == S * V, f"{name}: sequence logits size")
    sl = sl.reshape(S, V)
    check(float(np.abs(sl[:T] - lg).max()) < 1e-4, f"{name}: sequence logits rows 0..T-1 differ from prompt logits")
    for i, (tok, m) in enumerate(zip(ref["greedy_ids"], ref["greedy_margins"])):
        row = sl[T - 1 + i]
        if m > 1e-3:
            check(int(np.argmax(row)) == tok, f"{name}: step {i} teacher-forced argmax != greedy")
    cfg = json.load(open(os.path.join(d, "config.json")))
    vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    check(vocab == V, f"{name}: vocab mismatch")
    meta, st = read_safetensors(os.path.join(d, "model.safetensors"))
    dts = sorted({v[0] for v in st.values()})
    info = dict(T=T, V=V, absmax=float(np.abs(lg).max()), min_margin=min(ref["greedy_margins"]),
                tensors=len(st), dtypes=dts, gen=ref.get("generate_agrees"),
                bfd=ref.get("bf16_native_max_abs_diff"), bfg=ref.get("bf16_native_greedy_agrees"))
    return ref, cfg, st, info


def check_quant(root, name, ref, cfg, st):
    q = cfg.get("quantization")
    check(q is not None and cfg.get("quantization_config") == q, f"{name}: quantization block")
    bits, gs = q["bits"], q["group_size"]
    arch = name.split("-")[0]
    _, base = read_safetensors(os.path.join(root, f"{arch}-bf16", "model.safetensors"))
    tied = bool(cfg.get("tie_word_embeddings"))
    st = unstack_switch_mlp(st)
    nq = 0
    for k, (dt, arr, raw) in base.items():
        if tied and k == "lm_head.weight":
            check(k not in st, f"{name}: tied model has lm_head")
            continue
        if k.endswith(".weight") and arr.ndim == 2 and arr.shape[1] % gs == 0:
            pre = k[:-len(".weight")]
            check(st[k][0] == "U32" and st[pre + ".scales"][0] == "BF16" and st[pre + ".biases"][0] == "BF16",
                  f"{name}: {k} dtypes")
            codes, words, sc, bi = np_quantize(arr, gs, bits)
            check(np.array_equal(words, st[k][1]), f"{name}: {k} packed codes differ")
            check(np.array_equal(f32_to_bf16_bits(sc), np.frombuffer(st[pre + ".scales"][2], "<u2").reshape(sc.shape)),
                  f"{name}: {k} scales differ")
            check(np.array_equal(f32_to_bf16_bits(bi), np.frombuffer(st[pre + ".biases"][2], "<u2").reshape(bi.shape)),
                  f"{name}: {k} biases differ")
            nq += 1
        else:
            check(k in st and st[k][2] == raw, f"{name}: {k} not copied verbatim")
    check(nq == ref.get("quantized_tensors"), f"{name}: quantized tensor count {nq}")
    return nq


def unstack_switch_mlp(st):
    """mlx-lm stacks experts: L.mlp.switch_mlp.P.{weight,scales,biases} [E, ...] <- L.mlp.experts.E.P.*"""
    out = {}
    for k, (dt, arr, raw) in st.items():
        if ".switch_mlp." in k:
            E = arr.shape[0]
            n = len(raw) // E
            for e in range(E):
                out[k.replace(".switch_mlp.", f".experts.{e}.")] = (dt, arr[e], raw[e * n:(e + 1) * n])
        else:
            out[k] = (dt, arr, raw)
    return out


def check_quant_vectors(root):
    d = os.path.join(root, "quant_vectors")
    man = json.load(open(os.path.join(d, "manifest.json")))
    for c in man["cases"]:
        sub = os.path.join(d, c["dir"])
        R, C, bits, gs = c["rows"], c["cols"], c["bits"], c["group_size"]
        if c["input_dtype"] == "f32":
            w = np.fromfile(os.path.join(sub, "input.f32"), "<f4").reshape(R, C)
            sc_st = np.fromfile(os.path.join(sub, "scales.f32"), "<f4").reshape(R, -1)
            bi_st = np.fromfile(os.path.join(sub, "biases.f32"), "<f4").reshape(R, -1)
        else:
            w = bf16_to_f32(np.fromfile(os.path.join(sub, "input.bf16"), "<u2")).reshape(R, C)
            sc_st = bf16_to_f32(np.fromfile(os.path.join(sub, "scales.bf16"), "<u2")).reshape(R, -1)
            bi_st = bf16_to_f32(np.fromfile(os.path.join(sub, "biases.bf16"), "<u2")).reshape(R, -1)
        words_st = np.fromfile(os.path.join(sub, "codes.u32"), "<u4").reshape(R, -1)
        codes_st = np.fromfile(os.path.join(sub, "codes_unpacked.u8"), "u1").reshape(R, C)
        deq_st = np.fromfile(os.path.join(sub, "dequant.f32"), "<f4").reshape(R, C)
        codes, words, sc, bi = np_quantize(w, gs, bits)
        if c["input_dtype"] == "bf16":
            sc = bf16_to_f32(f32_to_bf16_bits(sc))
            bi = bf16_to_f32(f32_to_bf16_bits(bi))
        tag = f"quant_vectors/{c['dir']}"
        check(np.array_equal(words, words_st), f"{tag}: packed codes differ")
        check(np.array_equal(codes.astype(np.uint8), codes_st), f"{tag}: codes differ")
        check(np.array_equal(np_unpack(words_st, bits, C), codes_st.astype(np.uint32)), f"{tag}: unpack differs")
        check(np.array_equal(sc.view(np.uint32), sc_st.view(np.uint32)), f"{tag}: scales differ")
        check(np.array_equal(bi.view(np.uint32), bi_st.view(np.uint32)), f"{tag}: biases differ")
        q = codes_st.astype(F32).reshape(R, C // gs, gs)
        deq = ((sc_st[..., None] * q).astype(F32) + bi_st[..., None]).astype(F32).reshape(R, C)
        check(np.array_equal(deq.view(np.uint32), deq_st.view(np.uint32)), f"{tag}: dequant differs")
        err = np.abs(deq - w).reshape(R, C // gs, gs).max(-1)
        # the edge snap (scale = edge/q0) can leave the far end up to ~1 scale short
        bound = np.abs(sc_st) * 1.6 + 1e-6
        check((err <= bound).all(), f"{tag}: dequant error above 1.6*scale")
    print(f"quant_vectors: {len(man['cases'])} cases checked")



# ----------------------------------------------------------------------------
# New architectures (tools/make_fixtures.py NEW_ARCHS): MLX layouts re-derived with numpy
# from the <arch>-bf16 checkpoints, every quantized tensor re-quantized bit for bit.
# ----------------------------------------------------------------------------

NEW_ARCHS = ("qwen3_next", "qwen3_5_moe", "qwen3_5", "gemma3", "gpt_oss", "glm4_moe", "deepseek_v3")
PLUS1_SUFFIXES = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                  ".q_norm.weight", ".k_norm.weight")
Q8_OVERRIDE = {"group_size": 64, "bits": 8}


def bits_f32(t):
    """(dtype, array, raw) -> float32 values."""
    dt, arr, raw = t
    return np.asarray(arr, dtype=F32)


def mk(dt, arr):
    """A tensor entry from a float32/uint array in the given safetensors dtype."""
    arr = np.ascontiguousarray(arr)
    if dt == "BF16":
        b = f32_to_bf16_bits(arr)
        return ("BF16", bf16_to_f32(b), b.astype("<u2").tobytes())
    if dt == "F32":
        a = arr.astype("<f4")
        return ("F32", a, a.tobytes())
    if dt == "U8":
        return ("U8", arr.astype("u1"), arr.astype("u1").tobytes())
    raise ValueError(dt)


def np_sanitize(arch, base, cfg):
    """numpy version of make_fixtures.mlx_sanitize (bf16 hub checkpoint -> MLX names/layout)."""
    sd = dict(base)
    tcfg = cfg.get("text_config") or cfg
    if arch in ("qwen3_5_moe", "qwen3_5"):
        new = {}
        for k, v in sd.items():
            if k.startswith("model.language_model."):
                k = "language_model.model." + k[len("model.language_model."):]
            elif not k.startswith("language_model."):
                k = "language_model." + k
            new[k] = v
        sd = new
        for k in [k for k in sd if k.endswith("mlp.experts.gate_up_proj")]:
            dt, a, _ = sd.pop(k)
            mid = a.shape[-2] // 2
            pre = k[: -len("experts.gate_up_proj")]
            sd[pre + "switch_mlp.gate_proj.weight"] = mk(dt, a[..., :mid, :])
            sd[pre + "switch_mlp.up_proj.weight"] = mk(dt, a[..., mid:, :])
            sd[pre + "switch_mlp.down_proj.weight"] = sd.pop(pre + "experts.down_proj")
    if arch in ("qwen3_next", "glm4_moe", "deepseek_v3"):
        groups, out = {}, {}
        for k, v in sd.items():
            parts = k.split(".")
            if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
                i = parts.index("experts")
                key = ".".join(parts[:i]) + ".switch_mlp." + ".".join(parts[i + 2:])
                groups.setdefault(key, {})[int(parts[i + 1])] = v
            else:
                out[k] = v
        for key, d in groups.items():
            dt = d[0][0]
            out[key] = mk(dt, np.stack([d[e][1] for e in range(len(d))]))
        sd = out
    if arch in ("qwen3_next", "qwen3_5_moe", "qwen3_5"):
        for k in list(sd):
            dt, a, _ = sd[k]
            if k.endswith("conv1d.weight") and a.shape[-1] != 1:
                sd[k] = mk(dt, a.transpose(0, 2, 1))
            if any(k.endswith(sfx) for sfx in PLUS1_SUFFIXES) and a.ndim == 1:
                sd[k] = mk(dt, (a.astype(F32) + F32(1.0)).astype(F32))
    if arch == "gpt_oss":
        for k in [k for k in sd if k.endswith("mlp.experts.gate_up_proj")]:
            pre = k[: -len("gate_up_proj")]
            dt, a, _ = sd.pop(k)
            w = a.transpose(0, 2, 1)  # [E, 2I, H]
            sd[pre + "gate_proj.weight"] = mk(dt, w[:, 0::2, :])
            sd[pre + "up_proj.weight"] = mk(dt, w[:, 1::2, :])
            dt, b, _ = sd.pop(pre + "gate_up_proj_bias")
            sd[pre + "gate_proj.bias"] = mk(dt, b[:, 0::2])
            sd[pre + "up_proj.bias"] = mk(dt, b[:, 1::2])
            dt, dwn, _ = sd.pop(pre + "down_proj")
            sd[pre + "down_proj.weight"] = mk(dt, dwn.transpose(0, 2, 1))
            sd[pre + "down_proj.bias"] = sd.pop(pre + "down_proj_bias")
    if arch == "deepseek_v3":
        H, dn, dv = tcfg["num_attention_heads"], tcfg["qk_nope_head_dim"], tcfg["v_head_dim"]
        for k in [k for k in sd if k.endswith("self_attn.kv_b_proj.weight")]:
            pre = k[: -len("kv_b_proj.weight")]
            dt, a, _ = sd.pop(k)
            v = a.reshape(H, dn + dv, -1)
            sd[pre + "embed_q.weight"] = mk(dt, v[:, :dn, :].transpose(0, 2, 1))
            sd[pre + "unembed_out.weight"] = mk(dt, v[:, dn:, :])
    return sd


def np_mxfp4(w):
    """Second implementation of the MXFP4 quantizer (triton_kernels downcast_to_mxfp_torch
    semantics): blocks uint8 [..., K/32, 16], scales uint8 [..., K/32]."""
    w = np.asarray(w, dtype=F32)
    K = w.shape[-1]
    x = w.reshape(w.shape[:-1] + (K // 32, 32))
    amax = np.abs(x).max(axis=-1, keepdims=True)
    ds = (amax / F32(6.0)).astype(F32)
    di = ds.view(np.uint32).astype(np.int64)
    di = (di + 0x007FFFFF) & 0x7F800000
    dsr = di.astype(np.uint32).view(F32)
    with np.errstate(divide="ignore"):
        qs = np.where(dsr == 0, F32(0), F32(1) / dsr).astype(F32)
    q = (x * qs).astype(F32)
    u = q.view(np.uint32).astype(np.int64)
    sign = (u >> 31) & 1
    exp = (u >> 23) & 0xFF
    mant = u & 0x7FFFFF
    shift = np.clip(126 - exp, 0, 63)
    mant = np.where(exp < 127, (0x400000 | (mant >> 1)) >> shift, mant)
    e2 = np.maximum(exp, 126) - 126
    code = np.minimum((((e2 << 2) | (mant >> 21)) + 1) >> 1, 7) | (sign << 3)
    code = code.reshape(w.shape[:-1] + (K // 32, 16, 2))
    blocks = (code[..., 0] | (code[..., 1] << 4)).astype(np.uint8)
    scales = ((di >> 23) & 0xFF)[..., 0].astype(np.uint8)
    return blocks, scales


FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], F32)


def np_mxfp4_dequant(blocks, scales):
    v = np.stack([FP4[blocks & 15], FP4[blocks >> 4]], axis=-1).reshape(blocks.shape[:-1] + (32,))
    v = v * np.exp2(scales.astype(np.float64) - 127)[..., None].astype(F32)
    return v.reshape(blocks.shape[:-2] + (blocks.shape[-2] * 32,)).astype(F32)


def mlx_quantizable(arch, name, ndim):
    if not name.endswith(".weight") or ndim < 2 or name.endswith("conv1d.weight"):
        return False
    return not (arch in ("glm4_moe", "deepseek_v3") and name.endswith("mlp.gate.weight"))


def expected_override(arch, path, fine_grained):
    if arch in ("qwen3_next", "qwen3_5_moe") and (path.endswith("mlp.gate") or path.endswith("shared_expert_gate")):
        return Q8_OVERRIDE
    if arch == "gpt_oss" and path.endswith("router"):
        return Q8_OVERRIDE
    if fine_grained:
        return {"group_size": 64, "bits": 8, "mode": "affine"}
    return None


def check_new_quant(root, name, ref, cfg, st):
    """An MLX dir of a new arch: names/layout from np_sanitize(<arch>-bf16), affine tensors
    re-quantized bit for bit, mxfp4 experts re-quantized bit for bit, the rest byte-equal."""
    arch = name.split("-")[0]
    q = cfg.get("quantization")
    check(isinstance(q, dict) and cfg.get("quantization_config") == q, f"{name}: quantization block")
    _, base = read_safetensors(os.path.join(root, f"{arch}-bf16", "model.safetensors"))
    bcfg = json.load(open(os.path.join(root, f"{arch}-bf16", "config.json")))
    san = np_sanitize(arch, base, bcfg)
    top_mode = q.get("mode", "affine")
    fine = top_mode == "mxfp4"
    expect_names = set()
    nq = nmx = 0
    for k, src in san.items():
        path = k[: -len(".weight")] if k.endswith(".weight") else None
        a = src[1]
        if path and mlx_quantizable(arch, k, a.ndim) and a.shape[-1] % 64 == 0:
            if path in q:
                params = q[path]
                mode = params.get("mode", "affine")  # an entry without mode is affine, whatever the top level says
            else:
                params, mode = q, top_mode
            if mode == "mxfp4":
                check(path not in q, f"{name}: {path} mxfp4 but has its own entry")
                check(st[k][0] == "U32" and st[path + ".scales"][0] == "U8" and path + ".biases" not in st,
                      f"{name}: {k} mxfp4 dtypes")
                blocks, scales = np_mxfp4(bits_f32(src))
                check(st[k][2] == blocks.tobytes(), f"{name}: {k} mxfp4 blocks differ")
                check(list(st[k][1].shape) == list(a.shape[:-1]) + [a.shape[-1] // 8], f"{name}: {k} shape")
                check(st[path + ".scales"][2] == scales.tobytes(), f"{name}: {k} mxfp4 scales differ")
                expect_names |= {k, path + ".scales"}
                nmx += 1
                continue
            check(mode == "affine", f"{name}: {path} mode {mode}")
            ov = expected_override(arch, path, fine)
            check(q.get(path) == ov, f"{name}: {path} config entry {q.get(path)} != {ov}")
            bits, gs = params["bits"], params["group_size"]
            check(st[k][0] == "U32" and st[path + ".scales"][0] == "BF16" and st[path + ".biases"][0] == "BF16",
                  f"{name}: {k} dtypes")
            w2 = bits_f32(src).reshape(-1, a.shape[-1])
            codes, words, sc, bi = np_quantize(w2, gs, bits)
            check(np.array_equal(words.reshape(-1), st[k][1].reshape(-1)), f"{name}: {k} packed codes differ")
            check(list(st[k][1].shape) == list(a.shape[:-1]) + [a.shape[-1] * bits // 32], f"{name}: {k} shape")
            check(np.array_equal(f32_to_bf16_bits(sc).reshape(-1),
                                 np.frombuffer(st[path + ".scales"][2], "<u2")), f"{name}: {k} scales differ")
            check(np.array_equal(f32_to_bf16_bits(bi).reshape(-1),
                                 np.frombuffer(st[path + ".biases"][2], "<u2")), f"{name}: {k} biases differ")
            expect_names |= {k, path + ".scales", path + ".biases"}
            nq += 1
        else:
            check(k in st and st[k][0] == src[0] and st[k][2] == src[2], f"{name}: {k} not stored as sanitized")
            expect_names.add(k)
    extra = sorted(set(st) - expect_names)
    check(not extra, f"{name}: unexpected tensors {extra[:5]}")
    for path in q:
        if isinstance(q[path], dict):
            check(path + ".weight" in st, f"{name}: config entry for missing module {path}")
    check(nq + nmx == ref.get("quantized_tensors"), f"{name}: quantized tensor count {nq + nmx}")
    return nq, nmx


def check_mxfp4_hub(root, name, ref, cfg, st):
    """gpt_oss-mxfp4: experts re-quantized from gpt_oss-bf16, everything else byte-equal."""
    _, base = read_safetensors(os.path.join(root, "gpt_oss-bf16", "model.safetensors"))
    qc = cfg.get("quantization_config") or {}
    check(qc.get("quant_method") == "mxfp4" and "quantization" not in cfg, f"{name}: quantization_config")
    n = 0
    expect = set()
    for k, src in base.items():
        if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj"):
            w = bits_f32(src).transpose(0, 2, 1)  # [E, out, in]
            blocks, scales = np_mxfp4(w)
            b, s = st[k + "_blocks"], st[k + "_scales"]
            check(b[0] == "U8" and list(b[1].shape) == list(blocks.shape) and b[2] == blocks.tobytes(),
                  f"{name}: {k}_blocks differ")
            check(s[0] == "U8" and list(s[1].shape) == list(scales.shape) and s[2] == scales.tobytes(),
                  f"{name}: {k}_scales differ")
            deq = np_mxfp4_dequant(blocks, scales)
            err = np.abs(deq - w).reshape(deq.shape[:-1] + (-1, 32)).max(-1)
            smax = np.exp2(scales.astype(np.float64) - 127)  # e2m1 step <= 2 * scale
            check((err <= 1.0 * smax + 1e-30).all(), f"{name}: {k} dequant error above one scale step")
            expect |= {k + "_blocks", k + "_scales"}
            n += 1
        else:
            check(k in st and st[k][2] == src[2] and st[k][0] == src[0], f"{name}: {k} not copied verbatim")
            expect.add(k)
    check(set(st) == expect, f"{name}: unexpected tensors {sorted(set(st) - expect)[:5]}")
    return n


def check_new_plain(root, name, ref, cfg, st):
    """-f32 / -bf16 / gemma3_mm-bf16 of a new arch."""
    want = "F32" if name.endswith("-f32") else "BF16"
    for k, (dt, arr, raw) in st.items():
        ok = dt == want or (k.endswith("e_score_correction_bias") and dt == "F32")
        check(ok, f"{name}: {k} dtype {dt}")
    if name == "gemma3_mm-bf16":
        _, base = read_safetensors(os.path.join(root, "gemma3-bf16", "model.safetensors"))
        for k, v in base.items():
            k2 = "language_model." + k
            check(k2 in st and st[k2][2] == v[2], f"{name}: {k2} differs from gemma3-bf16 {k}")
        other = [k for k in st if not k.startswith("language_model.")]
        check(all(k.startswith("vision_tower.") or k.startswith("multi_modal_projector.") for k in other),
              f"{name}: unexpected non-text tensors")
        for f in ("reference_logits.f32", "reference_sequence_logits.f32"):
            check(open(os.path.join(root, name, f), "rb").read() == open(os.path.join(root, "gemma3-bf16", f), "rb").read(),
                  f"{name}: {f} differs from gemma3-bf16")
    return len(st)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    names = sorted(n for n in os.listdir(root)
                   if os.path.isfile(os.path.join(root, n, "reference.json")))
    for n in names:
        ref, cfg, st, info = check_model_dir(root, n)
        extra = ""
        arch = n.split("-")[0]
        if arch in NEW_ARCHS and ("-q" in n or n.endswith("-mlx-mxfp4q8")):
            nq, nmx = check_new_quant(root, n, ref, cfg, st)
            extra = f" quantized={nq} affine" + (f" + {nmx} mxfp4" if nmx else "") + " (bit-exact vs numpy)"
        elif n == "gpt_oss-mxfp4":
            nmx = check_mxfp4_hub(root, n, ref, cfg, st)
            extra = f" mxfp4={nmx} (bit-exact vs numpy)"
        elif "-q" in n:
            nq = check_quant(root, n, ref, cfg, st)
            extra = f" quantized={nq} (bit-exact vs numpy)"
        elif arch in NEW_ARCHS or arch == "gemma3_mm":
            check_new_plain(root, n, ref, cfg, st)
        print(f"{n:20s} T={info['T']} V={info['V']} |logit|max={info['absmax']:.2f} "
              f"min_margin={info['min_margin']:.4f} dtypes={info['dtypes']} gen_agrees={info['gen']}"
              + (f" bf16_native_diff={info['bfd']:.4f} native_greedy_agrees={info['bfg']}" if info["bfd"] is not None else "")
              + extra)
    if os.path.isdir(os.path.join(root, "quant_vectors")):
        check_quant_vectors(root)
    print(f"{len(names)} model dirs; {len(FAIL)} failures")
    sys.exit(1 if FAIL else 0)


if __name__ == "__main__":
    main()
