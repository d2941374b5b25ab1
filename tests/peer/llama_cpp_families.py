#!/usr/bin/env python3
"""Greedy replies of TensorFold and llama.cpp on the same random-weight f32 GGUFs,
one per family, written in llama.cpp's own layout with its gguf-py.

usage: llama_cpp_families.py [--llama-server BIN] [--greedy BIN] --gguf-py DIR
                             [--families qwen3moe,mistral,...] [--out DIR] [--tokens 32]
`cargo xtask agree` builds both and runs this. Either engine may run alone
(on another machine, on the files of --out); once both engines' replies are
in --out, prints per family on how many of the 20 prompts the 32 greedy
tokens are equal. Where they part, an independent f64 forward
(`f64_reference.py`: `llama`, `phi3`) says which engine gives the
exact result's tokens. Exits non-zero when a family has fewer than 19
prompts equal to llama.cpp's or, on the others, to the f64 reference's."""
import argparse, json, os, subprocess, sys, time, urllib.request

PROMPTS = 20
NEEDED = 19


def byte_symbols():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


# vocab, hidden, ff, layers, heads, kv heads, head dim, extras
FAMILIES = {
    "qwen3moe": dict(arch="qwen3moe", h=128, ff=256, layers=4, heads=4, kv=2, hd=32,
                     qk_norm=True, experts=(8, 2, 64), theta=1e6),
    "mistral": dict(arch="llama", h=128, ff=256, layers=4, heads=4, kv=2, hd=32, theta=1e6, untied=True),
    "phi3": dict(arch="phi3", h=128, ff=256, layers=4, heads=4, kv=4, hd=32, fused=True, theta=1e4,
                 untied=True),
    "gemma3": dict(arch="gemma3", h=256, ff=512, layers=6, heads=2, kv=1, hd=256, qk_norm=True, gemma=True,
                   window=16, theta=1e6),
    "gemma2": dict(arch="gemma2", h=256, ff=512, layers=4, heads=2, kv=1, hd=256, gemma=True, window=16,
                   softcap=(50.0, 30.0), theta=1e4),
    "mixtral": dict(arch="llama", h=128, ff=128, layers=4, heads=4, kv=2, hd=32, experts=(4, 2, 128),
                    theta=1e6, untied=True),
}


def write_gguf(path, name, f, seed):
    import numpy as np
    import gguf
    rng = np.random.default_rng(seed)
    arch, h, ff, L, nh, nkv, hd = f["arch"], f["h"], f["ff"], f["layers"], f["heads"], f["kv"], f["hd"]
    tokens = byte_symbols() + ["\u0120\u0120", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = len(tokens)
    w = gguf.GGUFWriter(path, arch)
    w.add_name("random weights")  # llama.cpp special-cases some names (phi3)
    w.add_context_length(4096)
    w.add_embedding_length(h)
    w.add_block_count(L)
    w.add_feed_forward_length(ff)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(f["theta"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(0)  # all f32
    if "experts" in f:
        n, used, eff = f["experts"]
        w.add_expert_count(n)
        w.add_expert_used_count(used)
        if arch != "llama":
            w.add_expert_feed_forward_length(eff)
    if "window" in f:
        w.add_sliding_window(f["window"])
    if "softcap" in f:
        w.add_attn_logit_softcapping(f["softcap"][0])
        w.add_final_logit_softcapping(f["softcap"][1])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")  # known to both engines; prompts are token ids
    w.add_token_list(tokens)
    w.add_token_types([1] * 257 + [3, 3, 3])
    w.add_token_merges(["\u0120 \u0120"])
    w.add_bos_token_id(257)
    w.add_eos_token_id(259)
    w.add_add_bos_token(False)

    def mat(*shape, gain=1.0):
        return (rng.standard_normal(shape, dtype=np.float32) * (gain / np.sqrt(shape[-1]))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    qw, kvw = nh * hd, nkv * hd

    def head(gain):
        # The rows past the 256 byte tokens give logit 0: llama.cpp's
        # ignore_eos bans end-of-generation tokens, so neither engine may
        # pick them (a random model's other logits are far above 0).
        m = mat(vocab, h, gain=gain)
        m[256:] = 0.0
        return m

    w.add_tensor("token_embd.weight", head(1.0 if f.get("gemma") else 4.0))
    for i in range(L):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(h))
        if f.get("fused"):
            w.add_tensor(p + "attn_qkv.weight", mat(qw + 2 * kvw, h))
        else:
            w.add_tensor(p + "attn_q.weight", mat(qw, h))
            w.add_tensor(p + "attn_k.weight", mat(kvw, h))
            w.add_tensor(p + "attn_v.weight", mat(kvw, h))
        w.add_tensor(p + "attn_output.weight", mat(h, qw))
        if f.get("qk_norm"):
            w.add_tensor(p + "attn_q_norm.weight", norm(hd))
            w.add_tensor(p + "attn_k_norm.weight", norm(hd))
        if f.get("gemma"):
            w.add_tensor(p + "post_attention_norm.weight", norm(h))
            w.add_tensor(p + "post_ffw_norm.weight", norm(h))
        w.add_tensor(p + "ffn_norm.weight", norm(h))
        if "experts" in f:
            n, used, eff = f["experts"]
            w.add_tensor(p + "ffn_gate_inp.weight", mat(n, h, gain=4.0))
            w.add_tensor(p + "ffn_gate_exps.weight", mat(n, eff, h))
            w.add_tensor(p + "ffn_up_exps.weight", mat(n, eff, h))
            w.add_tensor(p + "ffn_down_exps.weight", mat(n, h, eff))
        elif f.get("fused"):
            w.add_tensor(p + "ffn_up.weight", mat(2 * ff, h))
            w.add_tensor(p + "ffn_down.weight", mat(h, ff))
        else:
            w.add_tensor(p + "ffn_gate.weight", mat(ff, h))
            w.add_tensor(p + "ffn_up.weight", mat(ff, h))
            w.add_tensor(p + "ffn_down.weight", mat(h, ff))
    w.add_tensor("output_norm.weight", norm(h))
    if f.get("untied"):
        # Wide logits, so the greedy pick is rarely a near tie.
        w.add_tensor("output.weight", head(8.0))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def prompts(seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, 256, int(rng.integers(4, 41)))] for _ in range(PROMPTS)]


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def llama_cpp_greedy(server, model, ps, n, port, log, extra):
    proc = subprocess.Popen([server, "-m", model, "--port", str(port), "-t", "2", "-c", "1024", "-np", "1",
                             "-ngl", "0", "--no-warmup"] + extra, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({proc.returncode}); see {log.name}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.2)
        out = []
        for p in ps:
            r = post(base + "/completion", {"prompt": p, "n_predict": n, "temperature": 0.0, "top_k": 1,
                                            "ignore_eos": True, "cache_prompt": False, "return_tokens": True})
            out.append(r["tokens"])
        return out
    finally:
        proc.terminate()
        proc.wait()


def arbitrate(model, family, ps, ours, theirs, n):
    """On the prompts where the engines part: which one the f64 forward
    agrees with, token for token ({} for a family it does not compute)."""
    import f64_reference
    if not f64_reference.supports(family):
        return {}
    counts = {"tensorfold": 0, "llama.cpp": 0, "neither": 0}
    reference = f64_reference.Llama(model, family)
    for p, x, y in zip(ps, ours, theirs):
        if x != y:
            exact = f64_reference.greedy(reference, p, n)
            counts["tensorfold" if exact == x else "llama.cpp" if exact == y else "neither"] += 1
    return counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", help="llama.cpp's server: write its replies")
    ap.add_argument("--greedy", help="TensorFold's greedy example: write its replies")
    ap.add_argument("--gguf-py", required=True)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--out", default="target/peer-families")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--port", type=int, default=18431)
    # llama.cpp's CPU flash attention adds a row's weighted values in an f16
    # accumulator; without it they are added in f32, as TensorFold adds them,
    # so the engines part only where f32 rounding tips a near tie.
    ap.add_argument("--llama-args", default="-fa off", help="llama-server flags beyond the fixed ones")
    a = ap.parse_args()
    sys.path.insert(0, a.gguf_py)
    os.makedirs(a.out, exist_ok=True)
    ok = True
    report = {}
    for name in a.families.split(","):
        # A family's seeds follow its place in FAMILIES, not in --families,
        # so a subset run writes and asks the same as the full run.
        i = list(FAMILIES).index(name)
        # Each engine may run on another machine: the files are written
        # once and reused, and each engine's replies kept beside them.
        model = os.path.join(a.out, f"{name}-f32.gguf")
        if not os.path.exists(model):
            write_gguf(model, name, FAMILIES[name], seed=100 + i)
        ps = prompts(200 + i)
        replies = {e: os.path.join(a.out, f"{name}-{e}.json") for e in ("llama.cpp", "tensorfold")}
        if a.llama_server:
            with open(os.path.join(a.out, f"{name}-llama-server.log"), "w") as log:
                theirs = llama_cpp_greedy(a.llama_server, model, ps, a.tokens, a.port + i, log,
                                          a.llama_args.split())
            json.dump(theirs, open(replies["llama.cpp"], "w"))
        if a.greedy:
            ours = json.loads(subprocess.run([a.greedy, model, str(a.tokens)], input=json.dumps(ps),
                                             capture_output=True, text=True, check=True).stdout)
            json.dump(ours, open(replies["tensorfold"], "w"))
        if not all(os.path.exists(r) for r in replies.values()):
            continue
        theirs, ours = (json.load(open(replies[e])) for e in ("llama.cpp", "tensorfold"))
        equal = sum(1 for x, y in zip(ours, theirs) if x == y)
        first = [next((k for k, (u, v) in enumerate(zip(x, y)) if u != v), None) for x, y in zip(ours, theirs)]
        report[name] = {"equal": equal, "prompts": len(ps), "first_difference": first}
        print(f"{name}: {equal}/{len(ps)} prompts give the same {a.tokens} greedy tokens"
              + ("" if equal == len(ps) else f" (first differences at {[f for f in first if f is not None]})"),
              flush=True)
        exact = arbitrate(model, FAMILIES[name], ps, ours, theirs, a.tokens) if equal < len(ps) else {}
        if exact:
            report[name]["f64_reference"] = exact
            print(f"  where they part, the f64 reference gives TensorFold's tokens on {exact['tensorfold']}, "
                  f"llama.cpp's on {exact['llama.cpp']}, neither on {exact['neither']}", flush=True)
        ok &= equal + exact.get("tensorfold", 0) >= NEEDED
    if report:
        with open(os.path.join(a.out, "report.json"), "w") as f:
            json.dump(report, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
