//! Which files of a repository a name means.

use crate::error::{HubError, Result};
use crate::name::{names_quant, ModelName, Pick};
use crate::remote::RemoteFile;

/// The files a directory model needs besides its `*.safetensors`.
const DIRECTORY_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "model.safetensors.index.json",
];

/// A model inside a repository.
#[derive(Debug, Clone)]
pub enum Choice {
    /// One GGUF file.
    Gguf(RemoteFile),
    /// A Hugging Face directory (safetensors, plain or MLX): the small
    /// files, then the weights.
    Directory {
        small: Vec<RemoteFile>,
        weights: Vec<RemoteFile>,
    },
}

impl Choice {
    pub fn files(&self) -> Vec<&RemoteFile> {
        match self {
            Choice::Gguf(f) => vec![f],
            Choice::Directory { small, weights } => small.iter().chain(weights).collect(),
        }
    }
}

fn is_gguf(f: &RemoteFile) -> bool {
    f.name.to_ascii_lowercase().ends_with(".gguf")
}

fn list(files: &[&RemoteFile]) -> String {
    files
        .iter()
        .map(|f| f.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Picks the model `name` means among `files`.
pub fn choose(name: &ModelName, files: &[RemoteFile]) -> Result<Choice> {
    let ggufs: Vec<&RemoteFile> = files.iter().filter(|f| is_gguf(f)).collect();
    let by_quant = |quant: &str| -> Vec<&RemoteFile> {
        ggufs
            .iter()
            .copied()
            .filter(|f| names_quant(&f.name, quant))
            .collect()
    };
    let one = |found: Vec<&RemoteFile>, what: &str| -> Result<Choice> {
        match found.as_slice() {
            [f] => Ok(Choice::Gguf((*f).clone())),
            [] => Err(HubError::NotFound(format!(
                "{}: no {what} (GGUF files: {})",
                name.repo,
                if ggufs.is_empty() {
                    "none".to_string()
                } else {
                    list(&ggufs)
                }
            ))),
            many => Err(HubError::Choice(format!(
                "{name}: several files match ({}); name one as {}:FILE",
                list(many),
                name.repo
            ))),
        }
    };
    match &name.pick {
        Pick::File(file) => {
            let found = files
                .iter()
                .find(|f| &f.name == file)
                .ok_or_else(|| HubError::NotFound(format!("{}: no file {file}", name.repo)))?;
            if !is_gguf(found) {
                return Err(HubError::Choice(format!(
                    "{name}: REPO:FILE names a .gguf file; for a safetensors model name the repository alone"
                )));
            }
            Ok(Choice::Gguf(found.clone()))
        }
        Pick::Quant(quant) => one(by_quant(quant), &format!("GGUF file of quant type {quant}")),
        Pick::Default => {
            let top_level = |f: &&RemoteFile| !f.name.contains('/');
            let weights: Vec<RemoteFile> = files
                .iter()
                .filter(top_level)
                .filter(|f| f.name.ends_with(".safetensors"))
                .cloned()
                .collect();
            let has_config = files.iter().any(|f| f.name == "config.json");
            if has_config && !weights.is_empty() {
                let small = files
                    .iter()
                    .filter(|f| DIRECTORY_FILES.contains(&f.name.as_str()))
                    .cloned()
                    .collect();
                return Ok(Choice::Directory { small, weights });
            }
            match ggufs.as_slice() {
                [] => Err(HubError::NotFound(format!(
                    "{}: neither GGUF files nor config.json with safetensors weights",
                    name.repo
                ))),
                [single] => Ok(Choice::Gguf((*single).clone())),
                _ => match by_quant("Q4_K_M").as_slice() {
                    [f] => Ok(Choice::Gguf((*f).clone())),
                    _ => Err(HubError::Choice(format!(
                        "{}: several GGUF files ({}); name one as {}:QUANT or {}:FILE",
                        name.repo,
                        list(&ggufs),
                        name.repo,
                        name.repo
                    ))),
                },
            }
        }
    }
}
