//! What hf-hub's sync API leaves out: the repository listing with sizes
//! and sha256 hashes (`?blobs=true`) and byte-range reads of a file, which
//! let headers be checked before the weights are fetched.

use crate::error::{HubError, Result};
use crate::settings::Settings;
use serde::Deserialize;
use std::io::Read;

/// A file of a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    /// Path inside the repository.
    pub name: String,
    pub size: u64,
    /// The sha256 the hub records for a large (LFS) file; small files
    /// stored in git have none.
    pub sha256: Option<String>,
}

/// A repository at one commit.
#[derive(Debug, Clone)]
pub struct Listing {
    pub commit: String,
    pub files: Vec<RemoteFile>,
}

#[derive(Deserialize)]
struct RepoJson {
    sha: String,
    siblings: Vec<SiblingJson>,
}

#[derive(Deserialize)]
struct SiblingJson {
    rfilename: String,
    size: Option<u64>,
    lfs: Option<LfsJson>,
}

#[derive(Deserialize)]
struct LfsJson {
    sha256: String,
    size: u64,
}

pub struct Remote {
    agent: ureq::Agent,
    settings: Settings,
}

impl Remote {
    pub fn new(settings: &Settings) -> Remote {
        Remote {
            agent: ureq::AgentBuilder::new().try_proxy_from_env(true).build(),
            settings: settings.clone(),
        }
    }

    fn get(&self, url: &str) -> ureq::Request {
        let request = self.agent.get(url);
        match &self.settings.token {
            Some(token) => request.set("Authorization", &format!("Bearer {token}")),
            None => request,
        }
    }

    /// The files of `repo` at its main revision.
    pub fn listing(&self, repo: &str) -> Result<Listing> {
        let url = format!(
            "{}/api/models/{repo}/revision/main?blobs=true",
            self.settings.endpoint
        );
        let body = call(self.get(&url), &url, repo)?
            .into_string()
            .map_err(|e| http(&url, e))?;
        let json: RepoJson = serde_json::from_str(&body).map_err(|e| http(&url, e))?;
        let files = json
            .siblings
            .into_iter()
            .map(|s| {
                let (size, sha256) = match s.lfs {
                    Some(lfs) => (lfs.size, Some(lfs.sha256)),
                    None => (s.size.unwrap_or(0), None),
                };
                RemoteFile {
                    name: s.rfilename,
                    size,
                    sha256,
                }
            })
            .collect();
        Ok(Listing {
            commit: json.sha,
            files,
        })
    }

    /// The URL hf-hub downloads `file` from.
    pub fn file_url(&self, repo: &str, commit: &str, file: &str) -> String {
        format!("{}/{repo}/resolve/{commit}/{file}", self.settings.endpoint)
    }

    /// Bytes `start..end` of a file (fewer when the file is shorter).
    pub fn read_range(
        &self,
        repo: &str,
        commit: &str,
        file: &str,
        start: u64,
        end: u64,
    ) -> Result<Vec<u8>> {
        let url = self.file_url(repo, commit, file);
        let request = self
            .get(&url)
            .set("Range", &format!("bytes={start}-{}", end.saturating_sub(1)));
        let response = call(request, &url, repo)?;
        if response.status() != 206 {
            return Err(HubError::Http {
                url,
                message: format!(
                    "the server answered a range request with HTTP {}, not 206",
                    response.status()
                ),
            });
        }
        let mut bytes = Vec::new();
        response
            .into_reader()
            .take(end - start)
            .read_to_end(&mut bytes)
            .map_err(|e| http(&url, e))?;
        Ok(bytes)
    }
}

fn http(url: &str, e: impl std::fmt::Display) -> HubError {
    // ureq names the URL itself; the error names it once.
    let message = e.to_string();
    let message = message
        .strip_prefix(&format!("{url}: "))
        .unwrap_or(&message);
    HubError::Http {
        url: url.to_string(),
        message: message.to_string(),
    }
}

fn call(request: ureq::Request, url: &str, repo: &str) -> Result<ureq::Response> {
    match request.call() {
        Ok(response) => Ok(response),
        Err(ureq::Error::Status(404, _)) => Err(HubError::NotFound(format!(
            "{url}: not found (is `{repo}` a model repository on this hub?)"
        ))),
        Err(ureq::Error::Status(status @ (401 | 403), _)) => Err(HubError::Denied {
            url: url.to_string(),
            status,
        }),
        Err(e) => Err(http(url, e)),
    }
}
