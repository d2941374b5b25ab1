//! Hugging Face directories: `config.json`, `*.safetensors`, tokenizer files.

use crate::config::{ModelConfig, RopeStyle};
use crate::error::{ModelError, Result};
use crate::family;
use crate::weights::TensorSource;
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata};
use safetensors::SafeTensors;
use serde_json::Value;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use tensorfold_quant::{Format, Matrix};

/// One safetensors file, memory-mapped, with its parsed header.
struct Shard {
    map: Mmap,
    header_len: usize,
    meta: Metadata,
}

/// A Hugging Face model directory whose headers have been read.
pub struct HfDir {
    dir: PathBuf,
    config: Value,
    shards: Vec<Shard>,
    /// Tensor name -> shard index.
    index: HashMap<String, usize>,
}

pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| ModelError::Malformed(format!("{}: {e}", path.display())))
}

/// The Hugging Face name of a GGUF tensor name.
pub(crate) fn hf_name_of(gguf: &str) -> String {
    match gguf {
        "token_embd.weight" => return "model.embed_tokens.weight".into(),
        "output_norm.weight" => return "model.norm.weight".into(),
        "output.weight" => return "lm_head.weight".into(),
        _ => {}
    }
    let Some(rest) = gguf.strip_prefix("blk.") else {
        return gguf.into();
    };
    let (layer, rest) = rest.split_once('.').unwrap_or((rest, ""));
    let (part, suffix) = rest.rsplit_once('.').unwrap_or((rest, ""));
    let module = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        other => other,
    };
    format!("model.layers.{layer}.{module}.{suffix}")
}

impl HfDir {
    /// Reads `config.json` and the safetensors headers; refuses unsupported
    /// quantization before any weight is touched.
    pub fn open(dir: &Path) -> Result<HfDir> {
        let config = read_json(&dir.join("config.json"))?;
        refuse_quantization(&config)?;
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| ModelError::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(ModelError::Malformed(format!(
                "{}: no *.safetensors files",
                dir.display()
            )));
        }
        let mut shards = Vec::new();
        let mut index = HashMap::new();
        for path in files {
            let file = File::open(&path).map_err(|e| ModelError::io(&path, e))?;
            // SAFETY: the map is read-only and the file is not modified while
            // the model loads; a concurrent writer is outside the contract.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(&path, e))?;
            let (header_len, meta) = SafeTensors::read_metadata(&map)
                .map_err(|e| ModelError::Malformed(format!("{}: {e}", path.display())))?;
            for name in meta.tensors().keys() {
                index.insert(name.clone(), shards.len());
            }
            shards.push(Shard {
                map,
                header_len,
                meta,
            });
        }
        Ok(HfDir {
            dir: dir.to_path_buf(),
            config,
            shards,
            index,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config_json(&self) -> &Value {
        &self.config
    }

    /// Every tensor's (Hugging Face) name, shape and format.
    pub fn tensors(&self) -> Result<Vec<(String, Vec<usize>, Format)>> {
        let mut out = Vec::new();
        for shard in &self.shards {
            for (name, info) in shard.meta.tensors() {
                out.push((
                    name.clone(),
                    info.shape.clone(),
                    float_format(&name, info.dtype)?,
                ));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    pub fn config(&self) -> Result<ModelConfig> {
        let c = &self.config;
        let class = c["architectures"][0].as_str().unwrap_or_default();
        let fam = family::by_hf_class(class).ok_or_else(|| {
            ModelError::Unsupported(format!(
                "architecture '{class}' is not supported (supported: {})",
                family::supported()
            ))
        })?;
        if let Some(scaling) = c.get("rope_scaling").filter(|v| !v.is_null()) {
            let kind = scaling["rope_type"]
                .as_str()
                .or(scaling["type"].as_str())
                .unwrap_or("?");
            if kind != "default" {
                return Err(ModelError::Unsupported(format!(
                    "rope scaling '{kind}' is not supported"
                )));
            }
        }
        let need = |k: &str| {
            c[k].as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::Malformed(format!("config.json lacks {k}")))
        };
        let hidden = need("hidden_size")?;
        let heads = need("num_attention_heads")?;
        let theta = c["rope_theta"]
            .as_f64()
            .or(c["rope_parameters"]["rope_theta"].as_f64())
            .unwrap_or(10_000.0);
        let tied = c["tie_word_embeddings"].as_bool().unwrap_or(false)
            || !self.index.contains_key("lm_head.weight");
        Ok(ModelConfig {
            arch: fam.arch,
            vocab_size: need("vocab_size")?,
            hidden_size: hidden,
            intermediate_size: need("intermediate_size")?,
            layers: need("num_hidden_layers")?,
            heads,
            kv_heads: c["num_key_value_heads"]
                .as_u64()
                .map_or(heads, |v| v as usize),
            head_dim: c["head_dim"]
                .as_u64()
                .map_or(hidden / heads.max(1), |v| v as usize),
            rms_eps: c["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32,
            rope_theta: theta,
            rope_style: RopeStyle::Half,
            max_positions: c["max_position_embeddings"]
                .as_u64()
                .map_or(2048, |v| v as usize),
            tied_embeddings: tied,
            qkv_bias: fam.qkv_bias || c["attention_bias"].as_bool().unwrap_or(false),
            qk_norm: fam.qk_norm,
        })
    }
}

/// Only plain float checkpoints are read here; anything that declares a
/// quantization is refused by name.
fn refuse_quantization(config: &Value) -> Result<()> {
    for key in ["quantization", "quantization_config"] {
        if let Some(q) = config.get(key).filter(|v| !v.is_null()) {
            let method = q["quant_method"]
                .as_str()
                .unwrap_or(if key == "quantization" {
                    "mlx affine"
                } else {
                    "unknown"
                });
            return Err(ModelError::Unsupported(format!(
                "config.json declares {key} ({method}); supported checkpoints are f32/f16/bf16 safetensors \
                 and GGUF files (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K)"
            )));
        }
    }
    Ok(())
}

fn float_format(name: &str, dtype: Dtype) -> Result<Format> {
    match dtype {
        Dtype::F32 => Ok(Format::F32),
        Dtype::F16 => Ok(Format::F16),
        Dtype::BF16 => Ok(Format::Bf16),
        other => Err(ModelError::Unsupported(format!(
            "tensor {name} is {other:?}; safetensors weights must be F32, F16 or BF16"
        ))),
    }
}

impl TensorSource for HfDir {
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let hf = hf_name_of(name);
        let shard = self
            .index
            .get(&hf)
            .map(|&i| &self.shards[i])
            .ok_or_else(|| ModelError::Malformed(format!("checkpoint has no tensor {hf}")))?;
        let info = shard.meta.info(&hf).expect("indexed tensor");
        let format = float_format(&hf, info.dtype)?;
        if info.shape.iter().product::<usize>() != rows * cols {
            return Err(ModelError::Malformed(format!(
                "tensor {hf} has shape {:?}, expected {rows}x{cols}",
                info.shape
            )));
        }
        let (a, b) = info.data_offsets;
        let base = 8 + shard.header_len;
        let bytes = shard.map.get(base + a..base + b).ok_or_else(|| {
            ModelError::Malformed(format!("tensor {hf} lies past the end of its file"))
        })?;
        Ok(Matrix::from_bytes(format, rows, cols, bytes)?)
    }
}

#[cfg(test)]
mod tests {
    use super::hf_name_of as hf_name;

    #[test]
    fn gguf_names_map_to_hf_names() {
        assert_eq!(
            hf_name("blk.3.attn_q.bias"),
            "model.layers.3.self_attn.q_proj.bias"
        );
        assert_eq!(
            hf_name("blk.0.ffn_norm.weight"),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(hf_name("token_embd.weight"), "model.embed_tokens.weight");
    }
}
