use thiserror::Error;

#[derive(Debug, Error)]
pub enum HubError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Choice(String),
    #[error("{url}: access denied (HTTP {status}); set HF_TOKEN to a token that may read this repository")]
    Denied { url: String, status: u16 },
    #[error("{url}: {message}")]
    Http { url: String, message: String },
    #[error("{file}: sha256 {got} differs from the hub's {expected}; the download was removed, run the command again")]
    HashMismatch {
        file: String,
        expected: String,
        got: String,
    },
    #[error("{0} is not in the local cache and HF_HUB_OFFLINE is set")]
    Offline(String),
    #[error("{0}")]
    Unsupported(#[from] tensorfold_models::ModelError),
    #[error("download of {file}: {message}")]
    Download { file: String, message: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

impl HubError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> HubError {
        HubError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, HubError>;
