//! The shapes of real models, for random-weight files of real size.
//!
//! Only what decides the size and speed of a forward is real: the widths,
//! depth, heads, vocabulary size, rope base and whether the embeddings are
//! tied. The weights and the vocabulary's strings are synthetic.

use crate::config::Arch;
use crate::plan::Experts;

/// A model's shape and the hyper-parameters its GGUF metadata carries.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// The name `tensorfold synth --shape` takes.
    pub name: &'static str,
    pub arch: Arch,
    /// Rows of the embedding and output matrices (the padded size where the
    /// real model pads, as Qwen2.5-7B's 152064).
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    /// The window written to the file: 32k for every shape, whatever the
    /// trained model's, since random weights have no trained window and the
    /// long-context cells (8k depth, 32k prefill) must fit.
    pub context_length: usize,
    pub tied_embeddings: bool,
    /// `tokenizer.ggml.pre`: the pre-tokenizer llama.cpp and TensorFold
    /// apply before BPE.
    pub pre_tokenizer: &'static str,
    /// The routed experts that replace the dense MLP (`intermediate_size`
    /// is then unused).
    pub experts: Option<Experts>,
}

impl Shape {
    /// Every shape `tensorfold synth` knows.
    pub fn all() -> [Shape; 6] {
        [
            Shape {
                name: "llama3-8b",
                arch: Arch::Llama,
                vocab_size: 128_256,
                hidden_size: 4096,
                intermediate_size: 14_336,
                layers: 32,
                heads: 32,
                kv_heads: 8,
                head_dim: 128,
                rms_eps: 1e-5,
                rope_theta: 500_000.0,
                context_length: 32_768,
                tied_embeddings: false,
                pre_tokenizer: "llama3",
                experts: None,
            },
            Shape {
                name: "qwen2.5-7b",
                arch: Arch::Qwen2,
                vocab_size: 152_064,
                hidden_size: 3584,
                intermediate_size: 18_944,
                layers: 28,
                heads: 28,
                kv_heads: 4,
                head_dim: 128,
                rms_eps: 1e-6,
                rope_theta: 1_000_000.0,
                context_length: 32_768,
                tied_embeddings: false,
                pre_tokenizer: "qwen2",
                experts: None,
            },
            Shape {
                name: "smollm2",
                arch: Arch::Llama,
                vocab_size: 49_152,
                hidden_size: 576,
                intermediate_size: 1536,
                layers: 30,
                heads: 9,
                kv_heads: 3,
                head_dim: 64,
                rms_eps: 1e-5,
                rope_theta: 100_000.0,
                context_length: 32_768,
                tied_embeddings: true,
                pre_tokenizer: "smollm",
                experts: None,
            },
            Shape {
                name: "qwen2.5-0.5b",
                arch: Arch::Qwen2,
                vocab_size: 151_936,
                hidden_size: 896,
                intermediate_size: 4864,
                layers: 24,
                heads: 14,
                kv_heads: 2,
                head_dim: 64,
                rms_eps: 1e-6,
                rope_theta: 1_000_000.0,
                context_length: 32_768,
                tied_embeddings: true,
                pre_tokenizer: "qwen2",
                experts: None,
            },
            Shape {
                name: "llama3.2-1b",
                arch: Arch::Llama,
                vocab_size: 128_256,
                hidden_size: 2048,
                intermediate_size: 8192,
                layers: 16,
                heads: 32,
                kv_heads: 8,
                head_dim: 64,
                rms_eps: 1e-5,
                rope_theta: 500_000.0,
                // The real 128K window needs llama3 rope scaling, which
                // these files do not carry; 32K is what plain rope covers.
                context_length: 32_768,
                tied_embeddings: true,
                pre_tokenizer: "llama3",
                experts: None,
            },
            Shape {
                name: "qwen3-30b-a3b",
                arch: Arch::Qwen3Moe,
                vocab_size: 151_936,
                hidden_size: 2048,
                intermediate_size: 6144,
                layers: 48,
                heads: 32,
                kv_heads: 4,
                head_dim: 128,
                rms_eps: 1e-6,
                rope_theta: 1_000_000.0,
                context_length: 32_768,
                tied_embeddings: false,
                pre_tokenizer: "qwen2",
                experts: Some(Experts {
                    count: 128,
                    used: 8,
                    ff: 768,
                    norm_top_k: true,
                }),
            },
        ]
    }

    /// The shape called `name`.
    pub fn named(name: &str) -> Option<Shape> {
        Shape::all().into_iter().find(|s| s.name == name)
    }

    /// The known names, for messages.
    pub fn names() -> Vec<&'static str> {
        Shape::all().iter().map(|s| s.name).collect()
    }

    /// The same shape with another depth (tests want real widths, few layers).
    pub fn with_layers(self, layers: usize) -> Shape {
        Shape { layers, ..self }
    }

    /// Weights in every tensor, norms and biases included.
    pub fn parameters(&self) -> usize {
        let (h, ff, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let (qw, kvw) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let mlp = match self.experts {
            Some(e) => e.count * (h + 3 * h * e.ff),
            None => 3 * h * ff,
        };
        let mut per_layer = 2 * h * qw + 2 * h * kvw + mlp + 2 * h;
        if self.arch == Arch::Qwen2 {
            per_layer += qw + 2 * kvw;
        }
        if self.qk_norm() {
            per_layer += 2 * self.head_dim;
        }
        let heads = if self.tied_embeddings { 1 } else { 2 };
        heads * v * h + h + self.layers * per_layer
    }

    /// Whether the blocks norm each query and key head (Qwen3's families).
    pub(crate) fn qk_norm(&self) -> bool {
        matches!(self.arch, Arch::Qwen3 | Arch::Qwen3Moe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shapes_have_their_real_parameter_counts() {
        // Published sizes, to the nearest ten million.
        let expected = [
            ("llama3-8b", 8_030),
            ("qwen2.5-7b", 7_610),
            ("smollm2", 130),
            ("qwen2.5-0.5b", 490),
            ("llama3.2-1b", 1_230),
            ("qwen3-30b-a3b", 30_530),
        ];
        for (name, millions) in expected {
            let shape = Shape::named(name).unwrap();
            let got = shape.parameters() / 10_000_000 * 10;
            assert_eq!(got, millions, "{name}: {}", shape.parameters());
            if shape.experts.is_none() {
                assert_eq!(shape.hidden_size, shape.heads * shape.head_dim, "{name}");
            }
        }
        assert!(Shape::named("gpt-5").is_none());
    }
}
