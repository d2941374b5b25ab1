//! The shape and hyper-parameters of a decoder, whatever file it came from.

pub use crate::plan::Plan;
use serde::Serialize;

/// Supported model families (each one file of [`crate::family`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Mistral,
    Mixtral,
    Phi3,
    Gemma2,
    Gemma3,
}

impl Arch {
    /// The family's short name.
    pub fn name(self) -> &'static str {
        crate::family::of(self).name
    }

    /// `general.architecture` of the family's GGUF files.
    pub fn gguf_name(self) -> &'static str {
        crate::family::of(self).gguf_name
    }

    /// `architectures[0]` of the family's Hugging Face `config.json`.
    pub fn hf_class(self) -> &'static str {
        crate::family::of(self).hf_class
    }
}

/// How rotary embeddings pair the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RopeStyle {
    /// Dimensions `(2i, 2i + 1)`: GGUF llama, whose q/k rows were permuted
    /// at conversion.
    Interleaved,
    /// Dimensions `(i, i + d/2)`: Hugging Face layouts and GGUF qwen.
    Half,
}

/// Everything the forward needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rms_eps: f32,
    pub rope_theta: f64,
    pub rope_style: RopeStyle,
    /// The model's own context window.
    pub max_positions: usize,
    pub tied_embeddings: bool,
    /// Bias on the q, k and v projections (qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm on q and k before rotation (qwen3).
    pub qk_norm: bool,
    /// The block's parts beyond the Llama baseline.
    pub plan: Plan,
}

impl ModelConfig {
    /// Checks the shape is one the forward can run.
    pub fn validate(&self) -> Result<(), String> {
        // A block of experts has no dense MLP: its width may be zero.
        let dense_ff = match self.plan.experts {
            Some(_) => 1,
            None => self.intermediate_size,
        };
        let nonzero = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", dense_ff),
            ("layers", self.layers),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
        ];
        if let Some((name, _)) = nonzero.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} must be positive"));
        }
        // Bounds far above any real model keep every product of sizes
        // (a layer's weights, a cache row) inside `usize`.
        let bounded = [
            ("vocab_size", self.vocab_size, 1 << 24),
            ("hidden_size", self.hidden_size, 1 << 18),
            ("intermediate_size", self.intermediate_size, 1 << 20),
            ("layers", self.layers, 1 << 12),
            ("heads", self.heads, 1 << 12),
            ("kv_heads", self.kv_heads, 1 << 12),
            ("head_dim", self.head_dim, 1 << 12),
            ("max_positions", self.max_positions, 1 << 24),
        ];
        if let Some((name, value, limit)) = bounded.iter().find(|(_, v, limit)| v > limit) {
            return Err(format!(
                "{name} {value} exceeds the largest supported ({limit})"
            ));
        }
        if self.max_positions == 0 {
            return Err("max_positions must be positive".into());
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0) {
            return Err(format!(
                "rms_eps {} must be positive and finite",
                self.rms_eps
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(format!(
                "rope_theta {} must be positive and finite",
                self.rope_theta
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!(
                "{} heads do not group over {} kv heads",
                self.heads, self.kv_heads
            ));
        }
        if let Some(e) = &self.plan.experts {
            if e.count == 0 || e.used == 0 || e.used > e.count || e.ff == 0 {
                return Err(format!(
                    "{} of {} experts with width {} cannot route",
                    e.used, e.count, e.ff
                ));
            }
            if e.count > 1 << 12 || e.ff > 1 << 20 {
                return Err(format!(
                    "{} experts of width {} exceed the largest supported",
                    e.count, e.ff
                ));
            }
        }
        if self.plan.sliding_window.is_some_and(|w| w.size == 0) {
            return Err("sliding_window must be positive".into());
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!(
                "head_dim {} must be even for rotary embeddings",
                self.head_dim
            ));
        }
        Ok(())
    }

    pub fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }

    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// The KV cache shape for this model.
    pub fn kv_shape(&self) -> tensorfold_kv::KvShape {
        tensorfold_kv::KvShape {
            layers: self.layers,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        }
    }
}
