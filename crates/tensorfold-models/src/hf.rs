//! Hugging Face directories: `config.json`, `*.safetensors`, tokenizer files.

use crate::config::{ModelConfig, RopeStyle};
use crate::error::{ModelError, Result};
use crate::family::{self, Family};
use crate::mlx::MlxQuantization;
use crate::weights::TensorSource;
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata, TensorInfo};
use safetensors::SafeTensors;
use serde_json::Value;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use tensorfold_quant::{AffineBlocks, Encoding, Format, Matrix, ScaleDtype, Storage};

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
    /// The MLX `quantization` block, when the checkpoint has one.
    quant: Option<MlxQuantization>,
    shards: Vec<Shard>,
    /// Tensor name -> shard index.
    index: HashMap<String, usize>,
    /// The family `config.json` names, when supported.
    family: Option<Family>,
}

pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| ModelError::Malformed(format!("{}: {e}", path.display())))
}

/// The Hugging Face name of a GGUF tensor name in `fam`'s checkpoints.
pub(crate) fn hf_name_of(gguf: &str, fam: &Family) -> String {
    if let Some(name) = (fam.hf_name)(gguf) {
        return name;
    }
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
        let quant = MlxQuantization::from_config(&config)?;
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
        let family = config["architectures"][0]
            .as_str()
            .and_then(family::by_hf_class);
        Ok(HfDir {
            dir: dir.to_path_buf(),
            family,
            config,
            quant,
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

    /// Every tensor's (Hugging Face) name, shape and encoding. An affine
    /// module is one entry, `M.weight`, with its unpacked shape; its layout
    /// is checked against `config.json` here, before any weight is read.
    pub fn tensors(&self) -> Result<Vec<(String, Vec<usize>, Encoding)>> {
        let mut out = Vec::new();
        for shard in &self.shards {
            for (name, info) in shard.meta.tensors() {
                let module = name
                    .strip_suffix(".scales")
                    .or_else(|| name.strip_suffix(".biases"));
                if let Some(module) = module {
                    if self.index.contains_key(&format!("{module}.weight")) {
                        continue;
                    }
                    return Err(ModelError::Malformed(format!(
                        "tensor {name} has no {module}.weight"
                    )));
                }
                let entry = match self.affine_module(&name) {
                    Some(module) => {
                        let (shape, enc) = self.affine_layout(module)?;
                        (name.clone(), shape, enc)
                    }
                    None => (
                        name.clone(),
                        info.shape.clone(),
                        float_format(&name, info.dtype)?.into(),
                    ),
                };
                out.push(entry);
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
        // Older files name it at the top, transformers 5 in
        // `rope_parameters`, per layer type where types differ (Gemma 3).
        let theta = c["rope_theta"]
            .as_f64()
            .or(c["rope_parameters"]["rope_theta"].as_f64())
            .or(family::hf_layer_rope_theta(c, "full_attention"))
            .unwrap_or(10_000.0);
        let tied = c["tie_word_embeddings"].as_bool().unwrap_or(false)
            || !self.index.contains_key("lm_head.weight");
        let plan = (fam.hf_plan)(c)?;
        let experts = ["num_local_experts", "num_experts", "n_routed_experts"]
            .iter()
            .find_map(|k| c[*k].as_u64().filter(|n| *n > 0));
        if let Some(n) = experts.filter(|_| plan.experts.is_none()) {
            return Err(ModelError::Unsupported(format!(
                "architecture '{class}' with {n} experts: TensorFold routes experts only for {}",
                family::with_experts()
            )));
        }
        let dense_ff = match plan.experts {
            Some(_) => c["intermediate_size"].as_u64().map_or(0, |v| v as usize),
            None => need("intermediate_size")?,
        };
        Ok(ModelConfig {
            arch: fam.arch,
            vocab_size: need("vocab_size")?,
            hidden_size: hidden,
            intermediate_size: dense_ff,
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
            plan,
        })
    }
}

impl HfDir {
    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.index
            .get(name)
            .and_then(|&i| self.shards[i].meta.info(name))
    }

    fn bytes(&self, name: &str) -> Result<&[u8]> {
        let shard = self
            .index
            .get(name)
            .map(|&i| &self.shards[i])
            .ok_or_else(|| ModelError::Malformed(format!("checkpoint has no tensor {name}")))?;
        let info = shard.meta.info(name).expect("indexed tensor");
        let (a, b) = info.data_offsets;
        let base = 8 + shard.header_len;
        shard.map.get(base + a..base + b).ok_or_else(|| {
            ModelError::Malformed(format!("tensor {name} lies past the end of its file"))
        })
    }

    /// The module of `name` when it is an affine-packed weight (`M.weight`
    /// beside `M.scales`).
    fn affine_module<'a>(&self, name: &'a str) -> Option<&'a str> {
        name.strip_suffix(".weight")
            .filter(|m| self.index.contains_key(&format!("{m}.scales")))
    }

    /// The unpacked shape and encoding of an affine module, from headers:
    /// the packed width, the scales' shape and the config must agree.
    fn affine_layout(&self, module: &str) -> Result<(Vec<usize>, Encoding)> {
        let bad = |m: String| Err(ModelError::Malformed(format!("{module}: {m}")));
        let Some(quant) = &self.quant else {
            return Err(ModelError::Unsupported(format!(
                "{module} is affine-packed but config.json has no `quantization` block; {}",
                crate::mlx::SUPPORTED
            )));
        };
        let Some(spec) = quant.for_module(module) else {
            return bad("packed, but config.json's quantization keeps it in floats".into());
        };
        let (w, s, b) = (
            self.info(&format!("{module}.weight")),
            self.info(&format!("{module}.scales")),
            self.info(&format!("{module}.biases")),
        );
        let (Some(w), Some(s), Some(b)) = (w, s, b) else {
            return bad("affine modules need .weight, .scales and .biases".into());
        };
        if w.dtype != Dtype::U32 || w.shape.len() != 2 {
            return bad(format!(
                "packed weight must be 2-D U32, is {:?} {:?}",
                w.dtype, w.shape
            ));
        }
        let (rows, words) = (w.shape[0], w.shape[1]);
        let cols = words * 32 / spec.bits() as usize;
        let groups = vec![rows, cols / spec.group()];
        let dtype = match s.dtype {
            Dtype::F32 => ScaleDtype::F32,
            Dtype::F16 => ScaleDtype::F16,
            Dtype::BF16 => ScaleDtype::Bf16,
            other => return bad(format!("scales are {other:?}; must be F32, F16 or BF16")),
        };
        if !(words * 32).is_multiple_of(spec.bits() as usize)
            || !cols.is_multiple_of(spec.group())
            || s.shape != groups
            || b.shape != groups
            || b.dtype != s.dtype
        {
            return bad(format!(
                "weight {:?}, scales {:?} {:?} and biases {:?} {:?} do not fit {spec}",
                w.shape, s.dtype, s.shape, b.dtype, b.shape
            ));
        }
        Ok((vec![rows, cols], Encoding::Affine(spec, dtype)))
    }
}

fn float_format(name: &str, dtype: Dtype) -> Result<Format> {
    match dtype {
        Dtype::F32 => Ok(Format::F32),
        Dtype::F16 => Ok(Format::F16),
        Dtype::BF16 => Ok(Format::Bf16),
        other => Err(ModelError::Unsupported(format!(
            "tensor {name} is {other:?}; safetensors weights must be F32, F16 or BF16 \
             (or affine-packed U32 with .scales and .biases)"
        ))),
    }
}

impl HfDir {
    pub(crate) fn family(&self) -> Result<&Family> {
        self.family.as_ref().ok_or_else(|| {
            ModelError::Unsupported(format!(
                "{}: config.json names no supported architecture",
                self.dir.display()
            ))
        })
    }
}

impl TensorSource for HfDir {
    fn expert(
        &mut self,
        name: &str,
        e: usize,
        _count: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix> {
        let hf = (self.family()?.hf_expert)(name, e);
        self.hf_matrix(&hf, rows, cols)
    }

    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let hf = hf_name_of(name, self.family()?);
        self.hf_matrix(&hf, rows, cols)
    }
}

impl HfDir {
    /// The weight `hf` (a Hugging Face name) as a `rows x cols` matrix.
    fn hf_matrix(&self, hf: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let hf = hf.to_owned();
        if let Some(module) = self.affine_module(&hf) {
            let (shape, enc) = self.affine_layout(module)?;
            let Encoding::Affine(spec, dtype) = enc else {
                unreachable!("affine_layout answers affine encodings")
            };
            if shape != [rows, cols] {
                return Err(ModelError::Malformed(format!(
                    "tensor {hf} unpacks to {shape:?}, expected {rows}x{cols}"
                )));
            }
            let blocks = AffineBlocks::from_le_bytes(
                spec,
                dtype,
                rows,
                cols,
                self.bytes(&hf)?,
                self.bytes(&format!("{module}.scales"))?,
                self.bytes(&format!("{module}.biases"))?,
            )?;
            return Ok(Matrix::new(rows, cols, Storage::Affine(blocks))?);
        }
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
    fn hf_name(gguf: &str) -> String {
        super::hf_name_of(gguf, crate::family::of(crate::Arch::Llama))
    }

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
