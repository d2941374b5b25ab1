//! An independent reference forward in f64 with candle's tensor ops:
//! weights dequantized by candle's own GGUF/safetensors readers, the whole
//! sequence recomputed every step, no cache, no shared code with the
//! engine's kernels. Slow and simple on purpose.

use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, IndexOp, Tensor, D};
use std::collections::HashMap;
use std::path::Path;
use tensorfold_models::{ModelConfig, RopeStyle};

pub struct Reference {
    config: ModelConfig,
    /// f64 tensors by GGUF name.
    w: HashMap<String, Tensor>,
}

fn hf_to_gguf(name: &str) -> String {
    name.replace("model.embed_tokens.weight", "token_embd.weight")
        .replace("model.norm.weight", "output_norm.weight")
        .replace("lm_head.weight", "output.weight")
        .replace("model.layers.", "blk.")
        .replace("input_layernorm", "attn_norm")
        .replace("post_attention_layernorm", "ffn_norm")
        .replace("self_attn.q_proj", "attn_q")
        .replace("self_attn.k_proj", "attn_k")
        .replace("self_attn.v_proj", "attn_v")
        .replace("self_attn.o_proj", "attn_output")
        .replace("self_attn.q_norm", "attn_q_norm")
        .replace("self_attn.k_norm", "attn_k_norm")
        .replace("mlp.gate_proj", "ffn_gate")
        .replace("mlp.up_proj", "ffn_up")
        .replace("mlp.down_proj", "ffn_down")
}

impl Reference {
    pub fn load(path: &Path, config: ModelConfig) -> Reference {
        let dev = Device::Cpu;
        let mut w = HashMap::new();
        if path.is_file() {
            let mut f = std::fs::File::open(path).unwrap();
            let content = gguf_file::Content::read(&mut f).unwrap();
            for name in content.tensor_infos.keys() {
                let q = content.tensor(&mut f, name, &dev).unwrap();
                w.insert(
                    name.clone(),
                    q.dequantize(&dev).unwrap().to_dtype(DType::F64).unwrap(),
                );
            }
        } else {
            for entry in std::fs::read_dir(path).unwrap() {
                let p = entry.unwrap().path();
                if p.extension().is_some_and(|e| e == "safetensors") {
                    for (name, t) in candle_core::safetensors::load(&p, &dev).unwrap() {
                        w.insert(hf_to_gguf(&name), t.to_dtype(DType::F64).unwrap());
                    }
                }
            }
        }
        Reference { config, w }
    }

    fn t(&self, name: &str) -> &Tensor {
        self.w
            .get(name)
            .unwrap_or_else(|| panic!("reference: no tensor {name}"))
    }

    fn rms(&self, x: &Tensor, weight: &Tensor) -> Tensor {
        let eps = self.config.rms_eps as f64;
        let var = x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
        let x = x
            .broadcast_div(&(var + eps).unwrap().sqrt().unwrap())
            .unwrap();
        x.broadcast_mul(weight).unwrap()
    }

    fn linear(x: &Tensor, w: &Tensor) -> Tensor {
        x.matmul(&w.t().unwrap()).unwrap()
    }

    /// Rotates `x` of shape (seq, heads, head_dim).
    fn rope(&self, x: &Tensor) -> Tensor {
        let (seq, heads, d) = x.dims3().unwrap();
        let v: Vec<f64> = x.flatten_all().unwrap().to_vec1().unwrap();
        let mut out = v.clone();
        let half = d / 2;
        for p in 0..seq {
            for h in 0..heads {
                let base = (p * heads + h) * d;
                for i in 0..half {
                    let freq = self.config.rope_theta.powf(-((2 * i) as f64) / d as f64);
                    let (s, c) = (p as f64 * freq).sin_cos();
                    let (a, b) = match self.config.rope_style {
                        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                        RopeStyle::Half => (i, i + half),
                    };
                    out[base + a] = v[base + a] * c - v[base + b] * s;
                    out[base + b] = v[base + a] * s + v[base + b] * c;
                }
            }
        }
        Tensor::from_vec(out, (seq, heads, d), &Device::Cpu).unwrap()
    }

    /// Logits of the last position for the whole `tokens` sequence.
    pub fn last_logits(&self, tokens: &[u32]) -> Vec<f64> {
        let c = &self.config;
        let seq = tokens.len();
        let ids = Tensor::new(tokens, &Device::Cpu).unwrap();
        let mut x = self.t("token_embd.weight").index_select(&ids, 0).unwrap();
        let mask: Vec<f64> = (0..seq)
            .flat_map(|i| (0..seq).map(move |j| if j <= i { 0.0 } else { f64::NEG_INFINITY }))
            .collect();
        let mask = Tensor::from_vec(mask, (seq, seq), &Device::Cpu).unwrap();
        let group = c.heads / c.kv_heads;
        for l in 0..c.layers {
            let n = |s: &str| format!("blk.{l}.{s}");
            let xn = self.rms(&x, self.t(&n("attn_norm.weight")));
            let mut q = Self::linear(&xn, self.t(&n("attn_q.weight")));
            let mut k = Self::linear(&xn, self.t(&n("attn_k.weight")));
            let mut v = Self::linear(&xn, self.t(&n("attn_v.weight")));
            if c.qkv_bias {
                q = q.broadcast_add(self.t(&n("attn_q.bias"))).unwrap();
                k = k.broadcast_add(self.t(&n("attn_k.bias"))).unwrap();
                v = v.broadcast_add(self.t(&n("attn_v.bias"))).unwrap();
            }
            let mut q = q.reshape((seq, c.heads, c.head_dim)).unwrap();
            let mut k = k.reshape((seq, c.kv_heads, c.head_dim)).unwrap();
            let v = v.reshape((seq, c.kv_heads, c.head_dim)).unwrap();
            if c.qk_norm {
                q = self.rms(&q, self.t(&n("attn_q_norm.weight")));
                k = self.rms(&k, self.t(&n("attn_k_norm.weight")));
            }
            let (q, k) = (self.rope(&q), self.rope(&k));
            let mut heads = Vec::new();
            for h in 0..c.heads {
                let qh = q.i((.., h, ..)).unwrap();
                let kh = k.i((.., h / group, ..)).unwrap();
                let vh = v.i((.., h / group, ..)).unwrap();
                let s =
                    (qh.matmul(&kh.t().unwrap()).unwrap() / (c.head_dim as f64).sqrt()).unwrap();
                let s = s.broadcast_add(&mask).unwrap();
                let p = candle_core::Tensor::exp(
                    &s.broadcast_sub(&s.max_keepdim(D::Minus1).unwrap()).unwrap(),
                )
                .unwrap();
                let p = p.broadcast_div(&p.sum_keepdim(D::Minus1).unwrap()).unwrap();
                heads.push(p.matmul(&vh.contiguous().unwrap()).unwrap());
            }
            let attn = Tensor::cat(&heads, 1).unwrap();
            x = (x + Self::linear(&attn, self.t(&n("attn_output.weight")))).unwrap();
            let xn = self.rms(&x, self.t(&n("ffn_norm.weight")));
            let g = Self::linear(&xn, self.t(&n("ffn_gate.weight")));
            let u = Self::linear(&xn, self.t(&n("ffn_up.weight")));
            let silu = (&g / (g.neg().unwrap().exp().unwrap() + 1.0).unwrap()).unwrap();
            x = (x + Self::linear(&(silu * u).unwrap(), self.t(&n("ffn_down.weight")))).unwrap();
        }
        let last = self.rms(&x.i(seq - 1..seq).unwrap(), self.t("output_norm.weight"));
        let head = self
            .w
            .get("output.weight")
            .unwrap_or_else(|| self.t("token_embd.weight"));
        Self::linear(&last, head)
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    /// Greedy continuation of `prompt` for `n` tokens.
    pub fn greedy(&self, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut seq = prompt.to_vec();
        for _ in 0..n {
            let l = self.last_logits(&seq);
            let best = (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b });
            seq.push(best as u32);
        }
        seq[prompt.len()..].to_vec()
    }
}
