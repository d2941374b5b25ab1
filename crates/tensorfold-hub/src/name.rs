//! Model names: `REPO`, `REPO:FILE` or `REPO:QUANT`.

use std::fmt;

/// Which file(s) of a repository a name asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pick {
    /// The repository's model: its safetensors directory, its only GGUF
    /// file, or its Q4_K_M GGUF file (llama.cpp's and Ollama's default).
    Default,
    /// One file by its path in the repository (`REPO:FILE`, with an extension).
    File(String),
    /// The GGUF file of a quant type (`REPO:Q4_K_M`), matched case-insensitively.
    Quant(String),
}

/// A model on the hub: `owner/name` plus what to take from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelName {
    pub repo: String,
    pub pick: Pick,
}

impl ModelName {
    /// Parses `owner/name[:FILE|:QUANT]`; `None` for anything else (a
    /// local path, say).
    pub fn parse(text: &str) -> Option<ModelName> {
        let (repo, selector) = match text.split_once(':') {
            Some((repo, selector)) => (repo, Some(selector)),
            None => (text, None),
        };
        let (owner, name) = repo.split_once('/')?;
        let valid = |part: &str| {
            !part.is_empty()
                && !part.starts_with('.')
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if !valid(owner) || !valid(name) {
            return None;
        }
        let pick = match selector {
            None => Pick::Default,
            Some("") => return None,
            Some(s) if s.contains('.') => Pick::File(s.to_string()),
            Some(s) => Pick::Quant(s.to_string()),
        };
        Some(ModelName {
            repo: repo.to_string(),
            pick,
        })
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pick {
            Pick::Default => write!(f, "{}", self.repo),
            Pick::File(s) | Pick::Quant(s) => write!(f, "{}:{s}", self.repo),
        }
    }
}

/// Whether a GGUF file name carries the quant type `quant` as a whole word
/// (`q4_k_m` in `model-Q4_K_M.gguf`, but `Q4_K` not in it).
pub fn names_quant(file: &str, quant: &str) -> bool {
    let file = file.to_ascii_lowercase();
    let quant = quant.to_ascii_lowercase();
    let stem = file.strip_suffix(".gguf").unwrap_or(&file);
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    stem.match_indices(&quant).any(|(at, _)| {
        !word(stem[..at].chars().next_back()) && !word(stem[at + quant.len()..].chars().next())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_forms() {
        let n = ModelName::parse("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M").unwrap();
        assert_eq!(n.repo, "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF");
        assert_eq!(n.pick, Pick::Quant("Q4_K_M".into()));
        let n = ModelName::parse("org/repo:model-q8_0.gguf").unwrap();
        assert_eq!(n.pick, Pick::File("model-q8_0.gguf".into()));
        assert_eq!(
            ModelName::parse("HuggingFaceTB/SmolLM2-135M-Instruct")
                .unwrap()
                .pick,
            Pick::Default
        );
        for bad in ["model.gguf", "a/b/c", "/abs/path", "./x/y", "a/b:", "../x"] {
            assert_eq!(ModelName::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn quant_matches_whole_words() {
        assert!(names_quant(
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "Q4_K_M"
        ));
        assert!(!names_quant(
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "Q4_K"
        ));
        assert!(names_quant("Model.Q8_0.gguf", "q8_0"));
        assert!(!names_quant("model-iq4_xs.gguf", "q4_xs"));
    }
}
