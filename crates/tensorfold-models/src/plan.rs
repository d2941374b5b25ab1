//! A block plan: which parts a family's decoder blocks are made of. A
//! family file ([`crate::family`]) fills it from a file's configuration;
//! the forward ([`crate::decoder`]) interprets it; a backend that lacks a
//! part refuses the plan by name ([`Plan::features`]).

use serde::Serialize;

/// How a norm scales its normalized values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum NormKind {
    /// `x / rms(x) * w`.
    Rms,
    /// `x / rms(x) * (1 + w)` (Gemma stores weights around zero).
    RmsOffset,
}

/// The non-linearity of the gated MLP: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Activation {
    /// SwiGLU.
    Silu,
    /// GELU with the tanh approximation (Gemma).
    GeluTanh,
}

/// A mixture of experts in place of the dense MLP.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Experts {
    /// Experts per layer.
    pub count: usize,
    /// Experts each row is routed to (top-k).
    pub used: usize,
    /// Intermediate width of one expert.
    pub ff: usize,
    /// Whether the top-k weights are renormalized to sum to one after the
    /// softmax over every expert.
    pub norm_top_k: bool,
}

/// Which layers attend through the sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SlidingWindow {
    /// Keys a query sees: its own position and the `size - 1` before it.
    pub size: usize,
    /// Every `n`-th layer (layers `n-1, 2n-1, ...`) attends globally;
    /// `None`: every layer slides.
    pub global_every: Option<usize>,
}

impl SlidingWindow {
    pub fn applies_to(&self, layer: usize) -> bool {
        self.global_every
            .is_none_or(|n| n == 0 || !(layer + 1).is_multiple_of(n))
    }
}

/// The parts of a decoder block beyond the Llama baseline (RMSNorm,
/// grouped-query attention, SwiGLU, one rotary base). `Plan::default()` is
/// the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Plan {
    pub norm: NormKind,
    pub activation: Activation,
    /// A routed mixture of experts instead of the dense MLP.
    pub experts: Option<Experts>,
    pub sliding_window: Option<SlidingWindow>,
    /// The rotary base of sliding layers, when it differs (Gemma 3).
    pub local_rope_theta: Option<f64>,
    /// Attention scores become `cap * tanh(score / cap)`.
    pub attn_softcap: Option<f32>,
    /// Logits become `cap * tanh(logit / cap)`.
    pub final_softcap: Option<f32>,
    /// Scores are scaled by `1/sqrt(this)` instead of `1/sqrt(head_dim)`.
    pub query_scale_dim: Option<usize>,
    /// Embeddings are multiplied by `sqrt(hidden_size)`.
    pub embed_scale: bool,
    /// Norms after attention and after the MLP, before the residual add.
    pub post_norms: bool,
}

impl Default for Plan {
    fn default() -> Plan {
        Plan {
            norm: NormKind::Rms,
            activation: Activation::Silu,
            experts: None,
            sliding_window: None,
            local_rope_theta: None,
            attn_softcap: None,
            final_softcap: None,
            query_scale_dim: None,
            embed_scale: false,
            post_norms: false,
        }
    }
}

impl Plan {
    /// The parts beyond the baseline, by name, for a backend to refuse
    /// what it does not run.
    pub fn features(&self) -> Vec<&'static str> {
        let base = Plan::default();
        let checks = [
            (self.norm != base.norm, "(1+w) RMSNorm"),
            (self.activation != base.activation, "GELU MLP"),
            (self.experts.is_some(), "mixture of experts"),
            (self.sliding_window.is_some(), "sliding-window attention"),
            (self.local_rope_theta.is_some(), "a local rotary base"),
            (self.attn_softcap.is_some(), "attention logit soft-capping"),
            (self.final_softcap.is_some(), "final logit soft-capping"),
            (self.query_scale_dim.is_some(), "a query scale"),
            (self.embed_scale, "scaled embeddings"),
            (self.post_norms, "post-attention/post-MLP norms"),
        ];
        checks
            .into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, name)| name)
            .collect()
    }
}

/// The rotary angle of pair `i` of a head at absolute position `pos`,
/// computed in f64 from those alone: the one formula every backend uses.
pub fn rotary_angle(theta: f64, head_dim: usize, i: usize, pos: usize) -> f64 {
    pos as f64 * theta.powf(-((2 * i) as f64) / head_dim as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_baseline_has_no_features() {
        assert!(Plan::default().features().is_empty());
    }

    #[test]
    fn every_nth_layer_is_global() {
        let w = SlidingWindow {
            size: 4,
            global_every: Some(6),
        };
        let sliding: Vec<bool> = (0..12).map(|l| w.applies_to(l)).collect();
        assert_eq!(sliding.iter().filter(|s| !**s).count(), 2);
        assert!(!w.applies_to(5) && !w.applies_to(11) && w.applies_to(0));
    }
}
