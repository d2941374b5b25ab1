"""PyTorch/transformers on the same GPU and shapes as examples/bench.rs.

Random bf16 weights (transformers has no random-quantized path; its GGUF
loader dequantizes anyway), greedy decode through `generate` with a static
cache, and a plain prefill forward. Prints lines shaped like the bench's.
"""
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "smollm2": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    rope_theta=100000.0, tie_word_embeddings=True),
    "llama8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                    rope_theta=500000.0, tie_word_embeddings=False),
}


def sync_time(f):
    torch.cuda.synchronize()
    t = time.perf_counter()
    f()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main():
    names = sys.argv[1:] or list(SHAPES)
    torch.manual_seed(0)
    for name in names:
        cfg = LlamaConfig(max_position_embeddings=16384, **SHAPES[name])
        torch.set_default_dtype(torch.bfloat16)
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg).eval()
        torch.set_default_dtype(torch.float32)
        ids = torch.randint(0, cfg.vocab_size, (1, 8192), device="cuda")
        prompt = ids[:, :128]
        gen = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
        with torch.inference_mode():
            model.generate(prompt, max_new_tokens=8, min_new_tokens=8, **gen)
            t1 = sync_time(lambda: model.generate(prompt, max_new_tokens=1, min_new_tokens=1, **gen))
            n = 128
            tn = sync_time(lambda: model.generate(prompt, max_new_tokens=n + 1, min_new_tokens=n + 1, **gen))
            print(f"{name} torch bf16 decode: {n / (tn - t1):.1f} tok/s (generate, dynamic cache)")
            for len_ in (2048, 8192):
                model(ids[:, :256])
                s = sync_time(lambda: model(ids[:, :len_], logits_to_keep=1))
                print(f"{name} torch bf16 prefill {len_}: {len_ / s:.0f} tok/s")
            batch = ids[:16, :128].repeat(16, 1)
            t1 = sync_time(lambda: model.generate(batch, max_new_tokens=1, min_new_tokens=1, **gen))
            tn = sync_time(lambda: model.generate(batch, max_new_tokens=33, min_new_tokens=33, **gen))
            print(f"{name} torch bf16 16 streams: {16 * 32 / (tn - t1):.1f} tok/s aggregate")
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
