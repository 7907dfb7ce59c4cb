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
    check(cfg.get("vocab_size") == V, f"{name}: vocab mismatch")
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


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    names = sorted(n for n in os.listdir(root)
                   if os.path.isfile(os.path.join(root, n, "reference.json")))
    for n in names:
        ref, cfg, st, info = check_model_dir(root, n)
        extra = ""
        if "-q" in n:
            nq = check_quant(root, n, ref, cfg, st)
            extra = f" quantized={nq} (bit-exact vs numpy)"
        print(f"{n:18s} T={info['T']} V={info['V']} |logit|max={info['absmax']:.2f} "
              f"min_margin={info['min_margin']:.4f} dtypes={info['dtypes']} gen_agrees={info['gen']}"
              + (f" bf16_native_diff={info['bfd']:.4f} native_greedy_agrees={info['bfg']}" if info["bfd"] is not None else "")
              + extra)
    if os.path.isdir(os.path.join(root, "quant_vectors")):
        check_quant_vectors(root)
    print(f"{len(names)} model dirs; {len(FAIL)} failures")
    sys.exit(1 if FAIL else 0)


if __name__ == "__main__":
    main()
