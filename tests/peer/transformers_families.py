#!/usr/bin/env python3
"""Logits of TensorFold's CPU forward against PyTorch/transformers' on the same
random weights, one small model per family, written by transformers itself
(`save_pretrained`, f32 safetensors, its own config.json) and read back by
TensorFold's Hugging Face loader.

usage: transformers_families.py --logits BIN [--families qwen3moe,gemma2,...] [--out DIR]
                                [--device cpu|cuda] [--tolerance 1e-3]
`BIN` is the `logits` example of tensorfold-models. For each family, prints the
largest difference over every position of a few prompts, relative to the largest
logit, and on how many positions the argmax agrees. Exits non-zero when a family
is past the tolerance."""
import argparse, json, os, subprocess, sys

VOCAB = 300
PROMPTS, LENGTH = 4, 48  # longer than every sliding window below


def families():
    import transformers as t
    common = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                  max_position_embeddings=4096, tie_word_embeddings=False)
    gemma = dict(common, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=32,
                 sliding_window=16, tie_word_embeddings=True)
    return {
        "qwen3moe": (t.Qwen3MoeConfig(**common, moe_intermediate_size=64, num_experts=8,
                                      num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                                      mlp_only_layers=[], rope_theta=1e6), t.Qwen3MoeForCausalLM),
        "mixtral": (t.MixtralConfig(**{k: v for k, v in common.items() if k != "head_dim"},
                                    num_local_experts=4, num_experts_per_tok=2, rope_theta=1e6),
                    t.MixtralForCausalLM),
        "mistral": (t.MistralConfig(**common, sliding_window=16, rope_theta=1e6), t.MistralForCausalLM),
        "phi3": (t.Phi3Config(**dict({k: v for k, v in common.items() if k != "head_dim"},
                                     num_key_value_heads=4), rope_theta=1e4, pad_token_id=0),
                 t.Phi3ForCausalLM),
        "gemma2": (t.Gemma2Config(**gemma, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                  rope_theta=1e4), t.Gemma2ForCausalLM),
        "gemma3": (t.Gemma3TextConfig(**gemma, sliding_window_pattern=3, rope_theta=1e6,
                                      rope_local_base_freq=1e4), t.Gemma3ForCausalLM),
    }


def randomize(model, gemma, seed):
    """Weights at trained scales: matrices uniform at about 1/sqrt(inputs), norms
    near 1 (near 0 where the family multiplies by 1 + w)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            u = torch.rand(p.shape, generator=g, dtype=torch.float32) * 2 - 1
            if p.dim() == 1:
                p.copy_((0.0 if gemma else 1.0) + 0.2 * u)
            else:
                p.copy_(u * 1.7 / p.shape[-1] ** 0.5)


def write(name, config, cls, out, seed):
    import torch
    torch.manual_seed(seed)
    config._attn_implementation = "eager"  # soft-caps and windows as written
    model = cls(config).float().eval()
    randomize(model, name.startswith("gemma"), seed)
    d = os.path.join(out, name)
    model.save_pretrained(d, safe_serialization=True)
    # A character vocabulary TensorFold reads (`vocab.json`, no merges).
    vocab = {chr(0x100 + i): i for i in range(VOCAB)}
    json.dump(vocab, open(os.path.join(d, "vocab.json"), "w"), ensure_ascii=False)
    return model, d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--logits", required=True)
    ap.add_argument("--families")
    ap.add_argument("--out", default="transformers-families")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tolerance", type=float, default=1e-3)
    a = ap.parse_args()
    import torch, transformers
    os.makedirs(a.out, exist_ok=True)
    table = families()
    chosen = a.families.split(",") if a.families else list(table)
    g = torch.Generator().manual_seed(7)
    prompts = torch.randint(0, VOCAB, (PROMPTS, LENGTH), generator=g).tolist()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {a.device}")
    failed = []
    for name in chosen:
        # The seed follows the family's place in the table, not in
        # --families, so a subset run checks the same weights.
        i = list(table).index(name)
        config, cls = table[name]
        model, d = write(name, config, cls, a.out, 100 + i)
        model = model.to(a.device)
        with torch.no_grad():
            theirs = model(torch.tensor(prompts, device=a.device)).logits.float().cpu()
        run = subprocess.run([a.logits, d], input=json.dumps(prompts), capture_output=True, text=True)
        if run.returncode != 0:
            print(f"{name}: TensorFold failed: {run.stderr.strip()[-500:]}")
            failed.append(name)
            continue
        ours = torch.tensor(json.loads(run.stdout))
        scale = theirs.abs().max().item()
        diff = (ours - theirs).abs().max().item() / scale
        agree = (ours.argmax(-1) == theirs.argmax(-1)).sum().item()
        ok = diff <= a.tolerance
        print(f"{name}: max |difference| {diff:.2e} of the largest logit ({scale:.2f}); "
              f"argmax equal at {agree} of {PROMPTS * LENGTH} positions: {'ok' if ok else 'PAST TOLERANCE'}")
        if not ok:
            failed.append(name)
    if failed:
        sys.exit(f"past tolerance {a.tolerance}: {', '.join(failed)}")


if __name__ == "__main__":
    main()
