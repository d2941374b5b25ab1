//! Models by name from the Hugging Face Hub.
//!
//! `owner/name`, `owner/name:FILE` or `owner/name:QUANT` resolves to files
//! of the repository's main revision. Before any weight is fetched, the
//! GGUF header or `config.json` plus the safetensors headers are read (byte
//! ranges) and checked by `tensorfold_models::inspect`, so an unsupported
//! model is refused at once. Files are downloaded by the `hf-hub` crate
//! into the standard cache layout (shared with Python's `huggingface_hub`),
//! resuming a partial download, then checked against the hub's sha256; a
//! file that does not match is removed. `HF_ENDPOINT`, `HF_HOME`,
//! `HF_HUB_CACHE`, `HF_TOKEN` and `HF_HUB_OFFLINE` are honoured.
//!
//! ```no_run
//! let hub = tensorfold_hub::Hub::from_env();
//! let name = tensorfold_hub::ModelName::parse("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M").unwrap();
//! let path = hub.pull(&name)?;
//! # Ok::<(), tensorfold_hub::HubError>(())
//! ```

mod check;
mod choose;
mod error;
mod local;
mod name;
mod remote;
mod settings;

pub use choose::Choice;
pub use error::{HubError, Result};
pub use local::LocalModel;
pub use name::{ModelName, Pick};
pub use remote::RemoteFile;
pub use settings::{Settings, DEFAULT_ENDPOINT};

use remote::{Listing, Remote};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tensorfold_progress::{Progress, Unit};

pub struct Hub {
    settings: Settings,
}

impl Hub {
    pub fn from_env() -> Hub {
        Hub::new(Settings::from_env())
    }

    pub fn new(settings: Settings) -> Hub {
        Hub { settings }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The local path of `name` (a GGUF file or a snapshot directory),
    /// downloading what the cache lacks. Offline, or when the hub cannot
    /// be reached, the cache alone answers.
    pub fn pull(&self, name: &ModelName) -> Result<PathBuf> {
        if self.settings.offline {
            return local::resolve(&self.settings, name);
        }
        let remote = Remote::new(&self.settings);
        let listing = match remote.listing(&name.repo) {
            Ok(listing) => listing,
            Err(HubError::Http { url, message }) => {
                return local::resolve(&self.settings, name).map_err(|_| HubError::Http {
                    url,
                    message: format!("{message} (and {name} is not in the local cache)"),
                });
            }
            Err(e) => return Err(e),
        };
        let choice = choose::choose(name, &listing.files)?;
        let fetcher = Fetcher::new(&self.settings, &name.repo, &listing)?;
        let path = match &choice {
            Choice::Gguf(file) => {
                if !fetcher.cached(file) {
                    check::gguf(&remote, &name.repo, &listing.commit, file)?;
                }
                fetcher.fetch(file)?
            }
            Choice::Directory { small, weights } => {
                let mut config = None;
                for file in small {
                    let path = fetcher.fetch(file)?;
                    if file.name == "config.json" {
                        config = Some(path);
                    }
                }
                let config = config.expect("a directory choice has config.json");
                let missing: Vec<&RemoteFile> =
                    weights.iter().filter(|f| !fetcher.cached(f)).collect();
                if !missing.is_empty() {
                    let all: Vec<&RemoteFile> = weights.iter().collect();
                    check::directory(&remote, &name.repo, &listing.commit, &config, &all)?;
                }
                for file in weights {
                    fetcher.fetch(file)?;
                }
                fetcher.snapshot.clone()
            }
        };
        tensorfold_models::inspect(&path)?;
        Ok(path)
    }

    /// Models in the cache.
    pub fn list(&self) -> Vec<LocalModel> {
        local::list(&self.settings)
    }

    /// Removes `name` from the cache; returns the bytes freed.
    pub fn remove(&self, name: &ModelName) -> Result<u64> {
        local::remove(&self.settings, name)
    }
}

/// Downloads files of one repository at one commit through hf-hub.
struct Fetcher {
    api: hf_hub::api::sync::ApiRepo,
    repo_dir: PathBuf,
    snapshot: PathBuf,
}

impl Fetcher {
    fn new(settings: &Settings, repo: &str, listing: &Listing) -> Result<Fetcher> {
        let api =
            hf_hub::api::sync::ApiBuilder::from_cache(hf_hub::Cache::new(settings.cache.clone()))
                .with_endpoint(settings.endpoint.clone())
                .with_token(settings.token.clone())
                .with_progress(false)
                .build()
                .map_err(|e| HubError::Download {
                    file: repo.to_string(),
                    message: e.to_string(),
                })?;
        let repo_dir = settings.repo_dir(repo);
        Ok(Fetcher {
            api: api.model(repo.to_string()),
            snapshot: repo_dir.join("snapshots").join(&listing.commit),
            repo_dir,
        })
    }

    /// Whether `file` is in the cache at this commit (checked when fetched).
    fn cached(&self, file: &RemoteFile) -> bool {
        self.snapshot.join(&file.name).exists()
    }

    fn fetch(&self, file: &RemoteFile) -> Result<PathBuf> {
        let target = self.snapshot.join(&file.name);
        if target.exists() {
            return Ok(target);
        }
        // hf-hub keeps a partial download beside its blob and resumes it.
        let partial = file
            .sha256
            .as_ref()
            .map(|sha| self.repo_dir.join("blobs").join(format!("{sha}.part")))
            .and_then(|p| std::fs::metadata(p).ok())
            .map_or(0, |m| m.len());
        let label = if partial > 0 {
            format!("{} (resuming at {partial} bytes)", file.name)
        } else {
            file.name.clone()
        };
        let bar = Arc::new(Progress::new(label, Unit::Bytes, file.size));
        let result = self
            .api
            .download_with_progress(&file.name, ProgressHook(bar.clone()));
        let bar = Arc::into_inner(bar).expect("the download has returned");
        let path = match result {
            Ok(path) => path,
            Err(e) => {
                bar.abandon();
                return Err(HubError::Download {
                    file: file.name.clone(),
                    message: e.to_string(),
                });
            }
        };
        if let Err(e) = verify(&path, file) {
            bar.abandon();
            discard(&path);
            return Err(e);
        }
        bar.finish(if file.sha256.is_some() {
            "sha256 verified"
        } else {
            ""
        });
        Ok(path)
    }
}

/// hf-hub reports bytes as they arrive (and, resuming, the bytes already there).
struct ProgressHook(Arc<Progress>);

impl hf_hub::api::Progress for ProgressHook {
    fn init(&mut self, size: usize, _filename: &str) {
        self.0.set_total(size as u64);
    }

    fn update(&mut self, size: usize) {
        self.0.inc(size as u64);
    }

    fn finish(&mut self) {}
}

/// Checks a downloaded file against the hub's sha256 (large files) or size.
fn verify(path: &Path, file: &RemoteFile) -> Result<()> {
    let Some(expected) = &file.sha256 else {
        let size = std::fs::metadata(path)
            .map_err(|e| HubError::io(path, e))?
            .len();
        if file.size > 0 && size != file.size {
            return Err(HubError::Download {
                file: file.name.clone(),
                message: format!("{size} bytes, the hub lists {}", file.size),
            });
        }
        return Ok(());
    };
    let got = sha256_file(path)?;
    if &got != expected {
        return Err(HubError::HashMismatch {
            file: file.name.clone(),
            expected: expected.clone(),
            got,
        });
    }
    Ok(())
}

/// Removes a snapshot link and the blob it points at.
fn discard(link: &Path) {
    if let Ok(blob) = std::fs::canonicalize(link) {
        let _ = std::fs::remove_file(blob);
    }
    let _ = std::fs::remove_file(link);
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).map_err(|e| HubError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| HubError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}
