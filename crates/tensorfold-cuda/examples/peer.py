"""The PyTorch/transformers peer of `examples/bench.rs`, for the same GPU in
the same run: decode tokens/s (128 tokens after a 128-token prompt),
prefill tokens/s at 2k and 8k (in 256-token chunks, as the engine
prefills), and aggregate tokens/s of 16 streams decoding together.

    python3 peer.py smollm2 PATH/TO/smollm2.gguf   # transformers loads the GGUF (dequantized)
    python3 peer.py llama8b                        # a Llama-3-8B shape, random bf16 weights

transformers dequantizes a GGUF to a float dtype, so the 8B shape is built
from its config directly (no 5 GB file to carry): its speed does not depend
on the weights' values. Needs torch, transformers and (for GGUF) gguf.
"""

import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, LlamaForCausalLM

DTYPE = torch.bfloat16


def load(name, path):
    if name == "llama8b":
        config = LlamaConfig(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            rope_theta=500000.0,
            max_position_embeddings=16384,
            tie_word_embeddings=False,
        )
        with torch.device("cuda"):
            model = LlamaForCausalLM(config).to(DTYPE)
    else:
        folder, _, file = path.rpartition("/")
        model = AutoModelForCausalLM.from_pretrained(
            folder or ".", gguf_file=file, dtype=DTYPE
        ).to("cuda")
    return model.eval()


def sync():
    torch.cuda.synchronize()


@torch.inference_mode()
def prefill(model, ids, cache, chunk=256):
    out = None
    for start in range(0, ids.shape[1], chunk):
        out = model(ids[:, start : start + chunk], past_key_values=cache, use_cache=True)
    return out


@torch.inference_mode()
def main():
    name = sys.argv[1]
    model = load(name, sys.argv[2] if len(sys.argv) > 2 else "")
    vocab = model.config.vocab_size
    gen = torch.Generator(device="cuda").manual_seed(7)
    ids = torch.randint(0, vocab, (16, 8192), device="cuda", generator=gen)
    print(f"{name}: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{DTYPE}, {torch.cuda.get_device_name()}")

    # Decode: one token per forward after a 128-token prompt, greedy.
    cache = DynamicCache()
    out = prefill(model, ids[:1, :128], cache)
    token = out.logits[:, -1:].argmax(-1)
    for _ in range(8):
        token = model(token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
    sync()
    n = 128
    t = time.perf_counter()
    for _ in range(n):
        token = model(token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
    sync()
    s = time.perf_counter() - t
    print(f"peer decode: {n / s:.1f} tok/s ({1e3 * s / n:.3f} ms/token)")

    for length in (2048, 8192):
        prefill(model, ids[:1, :256], DynamicCache())
        sync()
        t = time.perf_counter()
        prefill(model, ids[:1, :length], DynamicCache())
        sync()
        s = time.perf_counter() - t
        print(f"peer prefill {length}: {length / s:.0f} tok/s ({s:.2f} s)")

    streams, rounds = 16, 64
    cache = DynamicCache()
    out = prefill(model, ids[:streams, :128], cache)
    token = out.logits[:, -1:].argmax(-1)
    token = model(token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
    sync()
    t = time.perf_counter()
    for _ in range(rounds):
        token = model(token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
    sync()
    s = time.perf_counter() - t
    print(f"peer {streams} streams: {streams * rounds / s:.1f} tok/s aggregate "
          f"({1e3 * s / rounds:.3f} ms per round)")


if __name__ == "__main__":
    main()
