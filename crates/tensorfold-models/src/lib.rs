//! Model definitions and loading.
//!
//! A model is a file or directory on disk: a GGUF file (weights, tokenizer,
//! chat template in one) or a Hugging Face directory (`config.json`,
//! safetensors, tokenizer files). [`inspect`] reads headers only; [`load`]
//! reads everything and returns a [`Bundle`]: the runnable [`Model`] plus
//! what a front-end needs to talk to it.
//!
//! ```no_run
//! let bundle = tensorfold_models::load("models/smollm2-135m-instruct-q4_1.gguf".as_ref())?;
//! let ids = bundle.tokenizer.encode("Hello", false).unwrap();
//! let mut cache = tensorfold_kv::KvCache::new(bundle.model.config.kv_shape());
//! let logits = bundle.model.forward(ids.get_ids(), &mut cache, tensorfold_models::Logits::Last);
//! # Ok::<(), tensorfold_models::ModelError>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

mod attention;
mod busy_pool;
mod config;
mod decoder;
mod error;
mod family;
mod gguf;
mod gguf_scan;
mod header_check;
mod hf;
pub mod mlx;
mod moe;
mod plan;
pub mod synth;
mod tokenizer;
mod weights;

pub use config::{Arch, ModelConfig, RopeStyle};
pub use decoder::{Block, Model};
pub use error::{ModelError, Result};
pub use gguf::GgufFile;
pub use hf::HfDir;
pub use moe::{route_experts, ExpertWeights};
pub use plan::{rotary_angle, Activation, Experts, NormKind, Plan, SlidingWindow};
pub use tensorfold_forward::{Forward, ForwardError, Logits, Seq};
pub use tensorfold_quant::{set_float_products, Affine, Encoding, Format, QuantRule, ScaleDtype};

use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Sampling defaults a model ships (`generation_config.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GenerationDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
}

/// A loaded model and everything needed to talk to it.
pub struct Bundle {
    pub name: String,
    pub model: Model,
    pub tokenizer: tokenizers::Tokenizer,
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// Token ids that end a reply.
    pub eos_ids: Vec<u32>,
    /// Whether prompts start with the BOS token.
    pub add_bos: Option<u32>,
    pub defaults: GenerationDefaults,
}

/// What a model's headers say, without reading weights.
#[derive(Debug, Clone, Serialize)]
pub struct ModelInfo {
    pub path: String,
    pub layout: &'static str,
    pub config: ModelConfig,
    /// Tensor count per storage format.
    pub formats: BTreeMap<String, usize>,
    pub parameters: usize,
    pub weight_bytes: usize,
}

fn is_gguf(path: &Path) -> bool {
    path.is_file()
}

/// Reads the header of a GGUF file or a Hugging Face directory and checks
/// that TensorFold can run it.
pub fn inspect(path: &Path) -> Result<ModelInfo> {
    if !path.exists() {
        return Err(ModelError::Io {
            path: path.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
        });
    }
    let elements = |shape: &Vec<usize>| shape.iter().product::<usize>();
    let (layout, config, tensors) = if is_gguf(path) {
        let f = GgufFile::open(path)?;
        let config = f.config()?;
        config.validate().map_err(ModelError::Malformed)?;
        let tensors: Vec<(String, Vec<usize>, Encoding)> = f
            .tensors()?
            .into_iter()
            .map(|(n, s, f)| (n, s, f.into()))
            .collect();
        let names = tensors.iter().map(|(n, s, _)| (n.clone(), elements(s)));
        header_check::check(&config, names, &|gguf, _| vec![gguf.to_owned()], true)?;
        ("gguf", config, tensors)
    } else {
        let d = HfDir::open(path)?;
        let config = d.config()?;
        config.validate().map_err(ModelError::Malformed)?;
        let tensors = d.tensors()?;
        let fam = d.family()?;
        let names = tensors.iter().map(|(n, s, _)| (n.clone(), elements(s)));
        let namer = |gguf: &str, expert: Option<usize>| match expert {
            Some(e) => vec![(fam.hf_expert)(gguf, e)],
            None => vec![hf::hf_name_of(gguf, fam)],
        };
        // Checkpoints carry extras (a tied head, rotary buffers): only
        // missing tensors are refused.
        header_check::check(&config, names, &namer, false)?;
        ("huggingface", config, tensors)
    };
    let mut formats = BTreeMap::new();
    let (mut parameters, mut weight_bytes) = (0, 0);
    for (_, shape, encoding) in &tensors {
        *formats.entry(encoding.name()).or_insert(0) += 1;
        let n: usize = shape.iter().product();
        parameters += n;
        let cols = shape.last().copied().unwrap_or(1).max(1);
        weight_bytes += encoding.matrix_bytes(n / cols, cols);
    }
    Ok(ModelInfo {
        path: path.display().to_string(),
        layout,
        config,
        formats,
        parameters,
        weight_bytes,
    })
}

/// Loads a model for running. Headers are checked first, so an unsupported
/// file is refused before weights are read.
pub fn load(path: &Path) -> Result<Bundle> {
    inspect(path)?;
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    if is_gguf(path) {
        load_gguf(path, name)
    } else {
        load_hf(path, name)
    }
}

fn load_gguf(path: &Path, name: String) -> Result<Bundle> {
    let mut f = GgufFile::open(path)?;
    let config = f.config()?;
    let md = f.metadata();
    let tokenizer = tokenizer::from_gguf(&md)?;
    let token = |key: &str| md.usize(key).map(|id| id as u32);
    let (bos, eos) = (
        token("tokenizer.ggml.bos_token_id"),
        token("tokenizer.ggml.eos_token_id"),
    );
    let text = |id: Option<u32>| id.and_then(|id| tokenizer.id_to_token(id));
    let mut eos_ids: Vec<u32> = eos.into_iter().collect();
    // Chat models also end a turn with their end-of-turn token.
    for t in ["<|im_end|>", "<|eot_id|>", "<|endoftext|>"] {
        if let Some(id) = tokenizer.token_to_id(t) {
            if !eos_ids.contains(&id) && (t != "<|endoftext|>" || eos_ids.is_empty()) {
                eos_ids.push(id);
            }
        }
    }
    let add_bos = if md.bool("tokenizer.ggml.add_bos_token").unwrap_or(false) {
        bos
    } else {
        None
    };
    let (bos_token, eos_token) = (text(bos), text(eos));
    let chat_template = f.chat_template();
    let model = weights::build(config, &mut f)?;
    Ok(Bundle {
        name,
        model,
        tokenizer,
        chat_template,
        bos_token,
        eos_token,
        eos_ids,
        add_bos,
        defaults: GenerationDefaults::default(),
    })
}

fn load_hf(dir: &Path, name: String) -> Result<Bundle> {
    let mut d = HfDir::open(dir)?;
    let config = d.config()?;
    let cfg_json = d.config_json().clone();
    let tk_config = hf::read_json(&dir.join("tokenizer_config.json")).ok();
    let special = |key: &str| -> Option<String> {
        let v = tk_config.as_ref()?.get(key)?;
        v.as_str()
            .map(str::to_owned)
            .or_else(|| v["content"].as_str().map(str::to_owned))
    };
    let tokenizer = if dir.join("tokenizer.json").exists() {
        tokenizer::from_file(&dir.join("tokenizer.json"))?
    } else if dir.join("vocab.json").exists() && !dir.join("merges.txt").exists() {
        tokenizer::from_char_vocab(&dir.join("vocab.json"), special("unk_token").as_deref())?
    } else {
        return Err(ModelError::Tokenizer(format!(
            "{}: no tokenizer.json or vocab.json",
            dir.display()
        )));
    };
    let generation = hf::read_json(&dir.join("generation_config.json")).ok();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        match v {
            serde_json::Value::Number(n) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
            serde_json::Value::Array(a) => a
                .iter()
                .filter_map(|x| x.as_u64().map(|n| n as u32))
                .collect(),
            _ => Vec::new(),
        }
    };
    let mut eos_ids = generation
        .as_ref()
        .map(|g| ids(&g["eos_token_id"]))
        .unwrap_or_default();
    if eos_ids.is_empty() {
        eos_ids = ids(&cfg_json["eos_token_id"]);
    }
    let eos_token = special("eos_token");
    if let Some(id) = eos_token.as_deref().and_then(|t| tokenizer.token_to_id(t)) {
        if !eos_ids.contains(&id) {
            eos_ids.push(id);
        }
    }
    let chat_template = std::fs::read_to_string(dir.join("chat_template.jinja"))
        .ok()
        .or_else(|| match tk_config.as_ref()?.get("chat_template")? {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Array(list) => list
                .iter()
                .find(|t| t["name"] == "default")
                .or(list.first())
                .and_then(|t| t["template"].as_str().map(str::to_owned)),
            _ => None,
        });
    let add_bos = tk_config
        .as_ref()
        .and_then(|t| t["add_bos_token"].as_bool())
        .filter(|b| *b)
        .and_then(|_| special("bos_token"))
        .and_then(|t| tokenizer.token_to_id(&t));
    let defaults = generation
        .as_ref()
        .map(|g| GenerationDefaults {
            temperature: g["temperature"].as_f64().map(|v| v as f32),
            top_p: g["top_p"].as_f64().map(|v| v as f32),
            top_k: g["top_k"].as_u64().map(|v| v as usize),
            min_p: g["min_p"].as_f64().map(|v| v as f32),
        })
        .unwrap_or_default();
    let model = weights::build(config, &mut d)?;
    Ok(Bundle {
        name,
        model,
        tokenizer,
        chat_template,
        bos_token: special("bos_token"),
        eos_token,
        eos_ids,
        add_bos,
        defaults,
    })
}
