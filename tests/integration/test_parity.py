#!/usr/bin/python3
"""Engine parity against Hugging Face transformers (fixtures made by
tools/make_fixtures.py on the GPU machine).

For every fixture model dir: `exo logits` on the prompt and on the
teacher-forced prompt+greedy sequence must match transformers' float32
logits within the dtype's tolerance, and the greedy continuation from
`exo run --tokens ... --print-ids` must equal transformers' token for token
up to the first near-tie (top-1/top-2 margin below the tolerance).

Quantized fixtures are checked twice: as written by the independent torch
quantizer (tests the loader and kernels), and re-quantized from llama-bf16
by `exo quantize` (tests our quantizer: must reproduce the same files'
logits). A copy of llama-f32 whose config.json only has transformers 5.x's
`rope_parameters` checks that spelling.

Tolerances (max abs logit error; logits are O(10)):
  f32 weights       2e-4   (f32 everywhere; sums in another order)
  bf16 weights      2e-3   (same, plus bf16 AMX prefill of the prompt)
  affine quantized  3e-2   (int8 activations in the decode kernels,
                            bf16 activations in the prefill GEMM)
The prompt path (12 tokens) uses the prefill GEMM; single tokens use GEMV.
Prints 'N passed, N failed'. Uses Debian's python3 + numpy only."""
import json, os, shutil, subprocess, sys, tempfile
import numpy as np

EXO = os.environ.get("EXO_BIN", "build/exo")
FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures")
passed = failed = 0


def tol_for(dtype):
    if dtype == "float32":
        return 2e-4
    if dtype == "bfloat16":
        return 2e-3
    return 3e-2


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def logits(model_dir, ids, V, extra=()):
    with tempfile.NamedTemporaryFile(suffix=".f32") as f:
        r = subprocess.run([EXO, "logits", model_dir, "--tokens", ",".join(map(str, ids)),
                            "--out", f.name, *extra], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(r.stderr)
        return np.fromfile(f.name, dtype=np.float32).reshape(len(ids), V)


def greedy(model_dir, ids, n):
    r = subprocess.run([EXO, "run", model_dir, "--tokens", ",".join(map(str, ids)), "--max-tokens",
                        str(n), "--print-ids", "--ignore-eos"], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr)
    return [int(x) for x in r.stdout.split()]


def check_model(name, model_dir, ref_dir):
    ref = json.load(open(os.path.join(ref_dir, "reference.json")))
    T, V = ref["logits_shape"]
    tol = tol_for(ref["dtype"])
    want = np.fromfile(os.path.join(ref_dir, ref["logits_file"]), dtype=np.float32).reshape(T, V)
    try:
        got = logits(model_dir, ref["prompt_ids"], V)
        err = float(np.abs(got - want).max())
        check(f"{name} prompt logits", err <= tol, f"max abs err {err:.3g} > {tol}")
        S, _ = ref["sequence_logits_shape"]
        want_seq = np.fromfile(os.path.join(ref_dir, ref["sequence_logits_file"]),
                               dtype=np.float32).reshape(S, V)
        # one token per forward: the decode (GEMV) path at every position
        got_seq = logits(model_dir, ref["sequence_ids"], V, ("--chunk", "1"))
        err = float(np.abs(got_seq - want_seq).max())
        check(f"{name} decode-path logits", err <= tol, f"max abs err {err:.3g} > {tol}")
        gen = greedy(model_dir, ref["prompt_ids"], len(ref["greedy_ids"]))
        n_ok = 0
        for g, w, margin in zip(gen, ref["greedy_ids"], ref["greedy_margins"]):
            if margin < 2 * tol:
                break  # a near-tie: beyond here either choice is right
            if g != w:
                break
            n_ok += 1
        steps = next((i for i, m in enumerate(ref["greedy_margins"]) if m < 2 * tol),
                     len(ref["greedy_ids"]))
        check(f"{name} greedy", n_ok >= steps, f"matched {n_ok} of {steps} decisive steps: "
              f"got {gen[:steps]} want {ref['greedy_ids'][:steps]}")
        print(f"ok   {name}: prompt/decode max err within {tol}, greedy {n_ok}/{steps}")
    except RuntimeError as e:
        check(name, False, str(e).strip())


def main():
    dirs = sorted(d for d in os.listdir(FIX)
                  if os.path.isfile(os.path.join(FIX, d, "reference.json")))
    for d in dirs:
        check_model(d, os.path.join(FIX, d), os.path.join(FIX, d))
    tmp = tempfile.mkdtemp(prefix="exo-parity-")
    try:
        # exo quantize must reproduce the torch quantizer's checkpoints
        for d in dirs:
            ref = json.load(open(os.path.join(FIX, d, "reference.json")))
            q = ref.get("quantization")
            if not q:
                continue
            base = ref.get("base") or d.split("-")[0] + "-bf16"
            out = os.path.join(tmp, d)
            r = subprocess.run([EXO, "quantize", os.path.join(FIX, base), out, "--bits",
                                str(q["bits"]), "--group-size", str(q["group_size"])],
                               capture_output=True, text=True)
            if r.returncode:
                check(f"exo quantize {d}", False, r.stderr.strip())
                continue
            check_model(f"exo-quantized {d}", out, os.path.join(FIX, d))
        # transformers 5.x config spelling only
        only_v5 = os.path.join(tmp, "llama-f32-rope-parameters")
        shutil.copytree(os.path.join(FIX, "llama-f32"), only_v5)
        cfg = json.load(open(os.path.join(only_v5, "config.json")))
        for k in ("rope_theta", "rope_scaling", "torch_dtype"):
            cfg.pop(k, None)
        json.dump(cfg, open(os.path.join(only_v5, "config.json"), "w"))
        check_model("llama-f32 (rope_parameters only)", only_v5, os.path.join(FIX, "llama-f32"))
    finally:
        shutil.rmtree(tmp)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
