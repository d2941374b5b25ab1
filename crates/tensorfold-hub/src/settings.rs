//! Where the hub is and where its files go, from the environment variables
//! Hugging Face's own tools read, so the cache is shared with them.

use std::path::PathBuf;

/// The default hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

#[derive(Debug, Clone)]
pub struct Settings {
    /// `HF_ENDPOINT`, else huggingface.co.
    pub endpoint: String,
    /// `HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
    pub cache: PathBuf,
    /// `HF_TOKEN`, else the token file `huggingface-cli login` writes.
    pub token: Option<String>,
    /// `HF_HUB_OFFLINE=1`: only what the cache holds.
    pub offline: bool,
}

impl Settings {
    pub fn from_env() -> Settings {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            let user = var("HOME").map(PathBuf::from).unwrap_or_default();
            var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| user.join(".cache"))
                .join("huggingface")
        });
        let cache = var("HF_HUB_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join("hub"));
        let token = var("HF_TOKEN").or_else(|| {
            std::fs::read_to_string(home.join("token"))
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        });
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| !matches!(v.as_str(), "0" | "false"));
        Settings {
            endpoint: var("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
                .trim_end_matches('/')
                .to_string(),
            cache,
            token,
            offline,
        }
    }

    /// The cache folder of one repository (`models--owner--name`).
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.cache
            .join(hf_hub::Repo::model(repo.to_string()).folder_name())
    }
}
