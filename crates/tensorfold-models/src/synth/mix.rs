//! Which storage format each tensor of a synthetic model gets, as
//! llama.cpp's `llama-quantize` would choose it.

use crate::error::{ModelError, Result};
use tensorfold_quant::Format;

/// What a tensor is, as far as choosing its format goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    TokenEmbd,
    Output,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    FfnGate,
    FfnUp,
    FfnDown,
    /// A mixture's router: f32, as llama-quantize leaves `ffn_gate_inp`.
    Router,
    /// Norm weights and biases: always f32, as llama.cpp keeps 1-D tensors.
    Vector,
}

/// The quantization of a synthetic model, by llama.cpp's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthQuant {
    /// Every matrix in one format (llama-quantize `--pure`).
    Uniform(Format),
    /// llama.cpp's Q4_K_M mix: Q4_K, with Q6_K for the output head and for
    /// attn_v and ffn_down in the layers `use_more_bits` picks.
    Q4KM,
}

impl SynthQuant {
    /// The names `parse` takes.
    pub const NAMES: &'static str =
        "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q4_K_M";

    pub fn parse(name: &str) -> Result<SynthQuant> {
        let upper = name.to_ascii_uppercase();
        if upper == "Q4_K_M" {
            return Ok(SynthQuant::Q4KM);
        }
        Format::ALL
            .into_iter()
            .find(|f| f.name() == upper)
            .map(SynthQuant::Uniform)
            .ok_or_else(|| {
                ModelError::Unsupported(format!(
                    "quant '{name}' is not one synth writes (known: {})",
                    SynthQuant::NAMES
                ))
            })
    }

    pub fn name(self) -> &'static str {
        match self {
            SynthQuant::Uniform(f) => f.name(),
            SynthQuant::Q4KM => "Q4_K_M",
        }
    }

    /// llama.cpp's `general.file_type` (`llama_ftype`). An all-k-quant file
    /// is called the `_S` mix of its type, the nearest llama.cpp has.
    pub fn file_type(self) -> u32 {
        match self {
            SynthQuant::Q4KM => 15,
            SynthQuant::Uniform(f) => match f {
                Format::F32 => 0,
                Format::F16 => 1,
                Format::Q4_0 => 2,
                Format::Q4_1 => 3,
                Format::Q8_0 => 7,
                Format::Q5_0 => 8,
                Format::Q5_1 => 9,
                Format::Q2K => 10,
                Format::Q3K => 11,
                Format::Q4K => 14,
                Format::Q5K => 16,
                Format::Q6K => 18,
                Format::Bf16 => 32,
            },
        }
    }

    /// The format a tensor gets before the row-length fallback. `tied`:
    /// the token embeddings double as the output head, and llama.cpp then
    /// quantizes them as the head.
    pub(crate) fn target(self, role: Role, layer: usize, layers: usize, tied: bool) -> Format {
        let format = match self {
            SynthQuant::Uniform(f) => f,
            SynthQuant::Q4KM => match role {
                Role::Output => Format::Q6K,
                Role::TokenEmbd if tied => Format::Q6K,
                Role::AttnV | Role::FfnDown if use_more_bits(layer, layers) => Format::Q6K,
                _ => Format::Q4K,
            },
        };
        if matches!(role, Role::Vector | Role::Router) {
            Format::F32
        } else {
            format
        }
    }
}

/// llama.cpp's choice of layers that get more bits in the `_M` mixes: the
/// first and last eighth, and every third layer between.
pub(crate) fn use_more_bits(layer: usize, layers: usize) -> bool {
    let (i, n) = (layer as i64, layers as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// What llama.cpp stores a k-quant tensor in when its rows (`cols` long)
/// are not whole 256-element super-blocks; `None` when `format` fits.
pub(crate) fn fallback(format: Format, cols: usize) -> Option<Format> {
    if cols.is_multiple_of(format.block_elems()) {
        return None;
    }
    match format {
        Format::Q4K => Some(Format::Q5_0),
        Format::Q5K => Some(Format::Q5_1),
        Format::Q6K => Some(Format::Q8_0),
        Format::Q2K | Format::Q3K => Some(Format::Q4_0),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_to_llama_cpp_file_types() {
        for (name, ftype) in [
            ("F32", 0),
            ("f16", 1),
            ("Q4_0", 2),
            ("Q4_1", 3),
            ("Q8_0", 7),
            ("Q5_0", 8),
            ("Q4_K_M", 15),
            ("q4_k_m", 15),
            ("Q4_K", 14),
            ("Q6_K", 18),
        ] {
            assert_eq!(
                SynthQuant::parse(name).unwrap().file_type(),
                ftype,
                "{name}"
            );
        }
        assert!(SynthQuant::parse("IQ2_XXS").is_err());
    }

    #[test]
    fn more_bits_go_to_llama_cpps_layers() {
        let picked = |n| (0..n).filter(|&i| use_more_bits(i, n)).collect::<Vec<_>>();
        // Llama 3 8B Q4_K_M as llama-quantize writes it: 16 of 32 layers.
        assert_eq!(
            picked(32),
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
        assert_eq!(picked(8), [0, 3, 6, 7]);
        assert_eq!(picked(2), [1]);
    }

    #[test]
    fn q4_k_m_puts_q6_k_on_the_head_and_the_chosen_layers() {
        let q = SynthQuant::Q4KM;
        assert_eq!(q.target(Role::Output, 0, 32, false), Format::Q6K);
        assert_eq!(q.target(Role::TokenEmbd, 0, 32, false), Format::Q4K);
        assert_eq!(q.target(Role::TokenEmbd, 0, 32, true), Format::Q6K);
        assert_eq!(q.target(Role::AttnV, 0, 32, false), Format::Q6K);
        assert_eq!(q.target(Role::AttnV, 4, 32, false), Format::Q4K);
        assert_eq!(q.target(Role::FfnDown, 6, 32, false), Format::Q6K);
        assert_eq!(q.target(Role::AttnQ, 0, 32, false), Format::Q4K);
        assert_eq!(q.target(Role::Vector, 0, 32, false), Format::F32);
        let pure = SynthQuant::Uniform(Format::Q4_1);
        assert_eq!(pure.target(Role::Output, 0, 32, false), Format::Q4_1);
    }

    #[test]
    fn k_quants_fall_back_on_short_rows_as_llama_cpp_does() {
        assert_eq!(fallback(Format::Q4K, 576), Some(Format::Q5_0));
        assert_eq!(fallback(Format::Q6K, 896), Some(Format::Q8_0));
        assert_eq!(fallback(Format::Q5K, 576), Some(Format::Q5_1));
        assert_eq!(fallback(Format::Q3K, 576), Some(Format::Q4_0));
        assert_eq!(fallback(Format::Q4K, 4096), None);
        assert_eq!(fallback(Format::Q8_0, 576), None);
    }
}
