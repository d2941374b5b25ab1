use thiserror::Error;

/// Why a model could not be read.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Malformed(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

impl ModelError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> ModelError {
        ModelError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

impl From<tensorfold_quant::QuantError> for ModelError {
    fn from(e: tensorfold_quant::QuantError) -> Self {
        ModelError::Malformed(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, ModelError>;
