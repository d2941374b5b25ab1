//! A local server speaking the hub's file API, as far as downloads use it:
//! `GET /api/models/OWNER/NAME/revision/REV?blobs=true` (the listing with
//! sizes and sha256) and `GET /OWNER/NAME/resolve/REV/FILE` with byte
//! ranges, `X-Repo-Commit`, `ETag` and `X-Linked-Etag`. It can cut a
//! download short once and advertise a wrong hash, and it logs every
//! file request with its `Range` header.

// Shared by two test crates, each using part of it.
#![allow(dead_code)]

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

pub struct HubFile {
    pub bytes: Vec<u8>,
    /// Stored as a large (LFS) file, with a sha256 in the listing.
    pub lfs: bool,
    /// A sha256 to advertise instead of the true one.
    pub advertised: Option<String>,
}

impl HubFile {
    pub fn lfs(bytes: Vec<u8>) -> HubFile {
        HubFile {
            bytes,
            lfs: true,
            advertised: None,
        }
    }

    pub fn small(bytes: Vec<u8>) -> HubFile {
        HubFile {
            bytes,
            lfs: false,
            advertised: None,
        }
    }

    fn sha256(&self) -> String {
        self.advertised
            .clone()
            .unwrap_or_else(|| format!("{:x}", Sha256::digest(&self.bytes)))
    }
}

#[derive(Default)]
pub struct HubState {
    /// repo -> file -> contents.
    pub repos: BTreeMap<String, BTreeMap<String, HubFile>>,
    /// Files whose next full download stops halfway.
    pub cut_once: BTreeSet<String>,
    /// (file, Range header) of every file request.
    pub log: Vec<(String, Option<String>)>,
}

pub struct HubServer {
    pub endpoint: String,
    pub state: Arc<Mutex<HubState>>,
    _runtime: tokio::runtime::Runtime,
}

impl HubServer {
    pub fn start(state: HubState) -> HubServer {
        let state = Arc::new(Mutex::new(state));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let app = Router::new()
            .route("/api/models/{owner}/{name}/revision/{rev}", get(listing))
            .route("/{owner}/{name}/resolve/{rev}/{*file}", get(resolve))
            .with_state(state.clone());
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        runtime.spawn(async move { axum::serve(listener, app).await });
        HubServer {
            endpoint,
            state,
            _runtime: runtime,
        }
    }

    /// Requests for `file`, with their Range headers.
    pub fn requests(&self, file: &str) -> Vec<Option<String>> {
        let state = self.state.lock().unwrap();
        state
            .log
            .iter()
            .filter(|(f, _)| f == file)
            .map(|(_, r)| r.clone())
            .collect()
    }
}

type Shared = Arc<Mutex<HubState>>;

async fn listing(
    State(s): State<Shared>,
    Path((owner, name, _rev)): Path<(String, String, String)>,
) -> Response {
    let state = s.lock().unwrap();
    let Some(files) = state.repos.get(&format!("{owner}/{name}")) else {
        return (StatusCode::NOT_FOUND, "Repository not found").into_response();
    };
    let siblings: Vec<_> = files
        .iter()
        .map(|(name, f)| {
            let mut entry = json!({"rfilename": name, "size": f.bytes.len()});
            if f.lfs {
                entry["lfs"] =
                    json!({"sha256": f.sha256(), "size": f.bytes.len(), "pointerSize": 134});
            }
            entry
        })
        .collect();
    Json(json!({"id": format!("{owner}/{name}"), "sha": COMMIT, "siblings": siblings}))
        .into_response()
}

async fn resolve(
    State(s): State<Shared>,
    Path((owner, name, _rev, file)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let range = headers
        .get("range")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut state = s.lock().unwrap();
    state.log.push((file.clone(), range.clone()));
    let Some(f) = state
        .repos
        .get(&format!("{owner}/{name}"))
        .and_then(|r| r.get(&file))
    else {
        return (StatusCode::NOT_FOUND, "Entry not found").into_response();
    };
    let total = f.bytes.len();
    let (start, end) = match range.as_deref().and_then(|r| r.strip_prefix("bytes=")) {
        Some(r) => {
            let (a, b) = r.split_once('-').unwrap();
            let a: usize = a.parse().unwrap();
            let b = if b.is_empty() {
                total - 1
            } else {
                b.parse::<usize>().unwrap().min(total - 1)
            };
            (a, b + 1)
        }
        None => (0, total),
    };
    let body = f.bytes[start..end].to_vec();
    let etag = if f.lfs {
        f.sha256()
    } else {
        format!("{:x}", Sha256::digest(&f.bytes))[..40].to_string()
    };
    let lfs = f.lfs;
    // hf-hub downloads with an open range (`bytes=N-`); header reads are closed.
    let open_range = range.as_deref().is_some_and(|r| r.ends_with('-'));
    let cut = start == 0 && open_range && state.cut_once.remove(&file);
    let mut response = if cut {
        // The connection drops halfway through the body.
        let half = Bytes::from(body[..body.len() / 2].to_vec());
        use futures_util::StreamExt;
        let stream = futures_util::stream::once(async { Ok(half) }).chain(
            futures_util::stream::once(async {
                // Let the first half reach the client before the cut.
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                Err(std::io::Error::other("connection cut"))
            }),
        );
        Response::new(Body::from_stream(stream))
    } else {
        Response::new(Body::from(body))
    };
    let h = response.headers_mut();
    h.insert("content-length", (end - start).into());
    h.insert("x-repo-commit", COMMIT.parse().unwrap());
    h.insert("etag", format!("\"{etag}\"").parse().unwrap());
    if lfs {
        h.insert("x-linked-etag", format!("\"{etag}\"").parse().unwrap());
    }
    h.insert("accept-ranges", "bytes".parse().unwrap());
    if range.is_some() {
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        response.headers_mut().insert(
            "content-range",
            format!("bytes {start}-{}/{total}", end - 1)
                .parse()
                .unwrap(),
        );
    }
    response
}
