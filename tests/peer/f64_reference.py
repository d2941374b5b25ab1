"""An independent forward in f64 (numpy) for the `llama` and `phi3`
architectures of the random-weight family files (Mistral, Mixtral's
experts; Phi-3's fused projections), to arbitrate a
prompt on which TensorFold's and llama.cpp's greedy replies part: both
engines round in f32, so where a near tie (a router's second and third
expert, two logits) falls, one of them may part from the exact result.

It reads the file with llama.cpp's gguf-py, so it shares no code with
either engine; it recomputes the whole context for each token (the files
are tiny)."""
import numpy as np


def greedy(model, prompt, n):
    """`n` greedy tokens of `model` (a `Llama`) after `prompt` (argmax,
    ties to the lower id)."""
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(np.argmax(model.last_logits(tokens))))
    return tokens[len(prompt):]


def swiglu(gate, up):
    return gate / (1 + np.exp(-gate)) * up


def supports(family):
    return family["arch"] in ("llama", "phi3")


class Llama:
    def __init__(self, path, family):
        import gguf
        reader = gguf.GGUFReader(path)
        self.t = {t.name: np.array(t.data, dtype=np.float64) for t in reader.tensors}
        self.layers, self.heads, self.kv_heads = family["layers"], family["heads"], family["kv"]
        self.head_dim, self.theta = family["hd"], family["theta"]
        self.experts_used = family["experts"][1] if "experts" in family else 0
        # Phi-3: one product for q|k|v and one for gate|up, and llama.cpp's
        # "neox" rotation (the first half of a head with the second).
        self.phi3 = family["arch"] == "phi3"

    def rms(self, x, weight):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * weight

    def rope(self, x, positions):
        # llama.cpp's "norm" rotation turns adjacent pairs, "neox" pairs
        # dimension i with i + head_dim/2.
        hd = self.head_dim
        freq = self.theta ** (-2.0 * np.arange(hd // 2) / hd)
        angle = positions[:, None] * freq[None, :]
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        pairs = (slice(0, hd // 2), slice(hd // 2, hd)) if self.phi3 else (slice(0, hd, 2), slice(1, hd, 2))
        first, second = x[..., pairs[0]], x[..., pairs[1]]
        y = np.empty_like(x)
        y[..., pairs[0]] = first * cos - second * sin
        y[..., pairs[1]] = first * sin + second * cos
        return y

    def project_qkv(self, p, h):
        t = self.t
        if self.phi3:
            q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
            qkv = h @ t[p + "attn_qkv.weight"].T
            return qkv[:, :q_width], qkv[:, q_width:q_width + kv_width], qkv[:, q_width + kv_width:]
        return tuple(h @ t[p + f"attn_{x}.weight"].T for x in "qkv")

    def attention(self, p, h, positions):
        n, hd, t = len(h), self.head_dim, self.t
        q, k, v = self.project_qkv(p, h)
        q = self.rope(q.reshape(n, self.heads, hd), positions)
        k = self.rope(k.reshape(n, self.kv_heads, hd), positions)
        v = v.reshape(n, self.kv_heads, hd)
        # Both engines keep keys and values in f16 (llama.cpp's default cache
        # type): the exact forward of what they compute rounds them too.
        k, v = (a.astype(np.float16).astype(np.float64) for a in (k, v))
        out = np.zeros((n, self.heads, hd))
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for head in range(self.heads):
            kv = head // (self.heads // self.kv_heads)
            s = q[:, head] @ k[:, kv].T / np.sqrt(hd) + mask
            w = np.exp(s - s.max(1, keepdims=True))
            out[:, head] = (w / w.sum(1, keepdims=True)) @ v[:, kv]
        return out.reshape(n, -1) @ t[p + "attn_output.weight"].T

    def mlp(self, p, h):
        t = self.t
        if self.phi3:
            gate, up = np.split(h @ t[p + "ffn_up.weight"].T, 2, axis=-1)
            return swiglu(gate, up) @ t[p + "ffn_down.weight"].T
        if not self.experts_used:
            gate, up = h @ t[p + "ffn_gate.weight"].T, h @ t[p + "ffn_up.weight"].T
            return swiglu(gate, up) @ t[p + "ffn_down.weight"].T
        # Softmax over every expert, the top k renormalized by their sum.
        router = h @ t[p + "ffn_gate_inp.weight"].T
        router = np.exp(router - router.max(1, keepdims=True))
        router /= router.sum(1, keepdims=True)
        out = np.zeros_like(h)
        for row in range(len(h)):
            top = np.argsort(-router[row], kind="stable")[: self.experts_used]
            weights = router[row, top] / router[row, top].sum()
            for e, w in zip(top, weights):
                gate = t[p + "ffn_gate_exps.weight"][e] @ h[row]
                up = t[p + "ffn_up_exps.weight"][e] @ h[row]
                out[row] += w * (t[p + "ffn_down_exps.weight"][e] @ swiglu(gate, up))
        return out

    def last_logits(self, tokens):
        t = self.t
        x = t["token_embd.weight"][tokens]
        positions = np.arange(len(tokens), dtype=np.float64)
        for layer in range(self.layers):
            p = f"blk.{layer}."
            x = x + self.attention(p, self.rms(x, t[p + "attn_norm.weight"]), positions)
            x = x + self.mlp(p, self.rms(x, t[p + "ffn_norm.weight"]))
        head = t.get("output.weight", t["token_embd.weight"])
        return self.rms(x[-1], t["output_norm.weight"]) @ head.T
