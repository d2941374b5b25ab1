//! Pulls from a local server that speaks the hub's file API: by quant, by
//! file, a safetensors directory; an interrupted download that resumes; a
//! hash that does not match; an unsupported model refused before its
//! weights are fetched; offline use, listing and removal.

mod hub_server;

use hub_server::{HubFile, HubServer, HubState, COMMIT};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tensorfold_hub::{Hub, HubError, ModelName, Settings};
use tensorfold_models::synth::{write_gguf, write_hf, SynthSpec};
use tensorfold_models::{Arch, Format};

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("hub")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn gguf_bytes(arch: Arch, format: Format, dir: &Path) -> Vec<u8> {
    let path = dir.join(format!("{}-{format}.gguf", arch.name()));
    write_gguf(&path, &SynthSpec::tiny(arch, format, 7)).unwrap();
    std::fs::read(path).unwrap()
}

fn hub(server: &HubServer, cache: &Path) -> Hub {
    Hub::new(Settings {
        endpoint: server.endpoint.clone(),
        cache: cache.to_path_buf(),
        token: None,
        offline: false,
    })
}

fn name(text: &str) -> ModelName {
    ModelName::parse(text).unwrap()
}

fn gguf_repo(dir: &Path) -> BTreeMap<String, HubFile> {
    let mut files = BTreeMap::new();
    files.insert(
        "tiny-Q8_0.gguf".into(),
        HubFile::lfs(gguf_bytes(Arch::Llama, Format::Q8_0, dir)),
    );
    files.insert(
        "tiny-Q4_0.gguf".into(),
        HubFile::lfs(gguf_bytes(Arch::Llama, Format::Q4_0, dir)),
    );
    files.insert("README.md".into(), HubFile::small(b"# tiny\n".to_vec()));
    files
}

/// Files under `dir`, recursively, relative to it.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn an_interrupted_download_resumes_into_the_standard_cache() {
    let dir = scratch("resume");
    let mut state = HubState::default();
    state.repos.insert("test/tiny-GGUF".into(), gguf_repo(&dir));
    state.cut_once.insert("tiny-Q8_0.gguf".into());
    let server = HubServer::start(state);
    let cache = dir.join("cache");
    let hub = hub(&server, &cache);

    let first = hub.pull(&name("test/tiny-GGUF:Q8_0"));
    assert!(matches!(first, Err(HubError::Download { .. })), "{first:?}");
    let want = server.state.lock().unwrap().repos["test/tiny-GGUF"]["tiny-Q8_0.gguf"]
        .bytes
        .clone();
    let sha = format!("{:x}", <sha2::Sha256 as sha2::Digest>::digest(&want));
    let repo = cache.join("models--test--tiny-GGUF");
    let partial = std::fs::metadata(repo.join("blobs").join(format!("{sha}.part")))
        .expect("the partial download is kept")
        .len();
    assert_eq!(partial as usize, want.len() / 2);

    let path = hub.pull(&name("test/tiny-GGUF:Q8_0")).unwrap();
    assert_eq!(
        path,
        repo.join("snapshots").join(COMMIT).join("tiny-Q8_0.gguf")
    );
    assert_eq!(std::fs::read(&path).unwrap(), want);
    assert!(path.is_symlink(), "snapshots link to blobs");
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        COMMIT
    );
    assert!(repo.join("blobs").join(&sha).is_file());
    // The second download asked only for the missing half.
    let ranges = server.requests("tiny-Q8_0.gguf");
    assert!(
        ranges.contains(&Some(format!("bytes={partial}-"))),
        "{ranges:?}"
    );
    // Only the file asked for was fetched.
    assert!(server.requests("tiny-Q4_0.gguf").is_empty());
    assert!(
        !tree(&repo).iter().any(|f| f.ends_with(".part")),
        "{:?}",
        tree(&repo)
    );

    // A second pull is served from the cache; offline too.
    let again = hub.pull(&name("test/tiny-GGUF:Q8_0")).unwrap();
    assert_eq!(again, path);
    let offline = Hub::new(Settings {
        endpoint: "http://127.0.0.1:9".into(),
        offline: true,
        ..hub.settings().clone()
    });
    assert_eq!(offline.pull(&name("test/tiny-GGUF:q8_0")).unwrap(), path);
    assert!(matches!(
        offline.pull(&name("test/tiny-GGUF:Q4_0")),
        Err(HubError::Offline(_))
    ));

    let listed = hub.list();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].name, "test/tiny-GGUF:tiny-Q8_0.gguf");
    assert_eq!(listed[0].size as usize, want.len());

    let freed = hub.remove(&name("test/tiny-GGUF:tiny-Q8_0.gguf")).unwrap();
    assert_eq!(freed as usize, want.len());
    assert!(hub.list().is_empty());
    assert!(!repo.join("blobs").join(&sha).exists());
}

#[test]
fn a_hash_that_does_not_match_leaves_nothing_in_the_cache() {
    let dir = scratch("hash");
    let mut files = gguf_repo(&dir);
    files.get_mut("tiny-Q4_0.gguf").unwrap().advertised = Some("ab".repeat(32));
    let mut state = HubState::default();
    state.repos.insert("test/tiny-GGUF".into(), files);
    let server = HubServer::start(state);
    let cache = dir.join("cache");
    let err = hub(&server, &cache)
        .pull(&name("test/tiny-GGUF:Q4_0"))
        .unwrap_err();
    assert!(matches!(err, HubError::HashMismatch { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("sha256") && message.contains(&"ab".repeat(32)),
        "{message}"
    );
    let repo = cache.join("models--test--tiny-GGUF");
    let left: Vec<String> = tree(&repo)
        .into_iter()
        .filter(|f| !f.ends_with(".lock") && !f.starts_with("refs"))
        .collect();
    assert!(left.is_empty(), "left in the cache: {left:?}");
    assert!(hub(&server, &cache).list().is_empty());
}

#[test]
fn an_unsupported_gguf_is_refused_from_its_header_alone() {
    let dir = scratch("refuse-gguf");
    // A Qwen2 file whose architecture is renamed to one TensorFold lacks.
    let mut bytes = gguf_bytes(Arch::Qwen2, Format::Q8_0, &dir);
    let from = b"qwen2";
    let mut at = 0;
    while let Some(i) = bytes[at..].windows(5).position(|w| w == from) {
        bytes[at + i..at + i + 5].copy_from_slice(b"gpt-j");
        at += i + 5;
    }
    let mut files = BTreeMap::new();
    files.insert("odd.gguf".to_string(), HubFile::lfs(bytes));
    let mut state = HubState::default();
    state.repos.insert("test/odd".into(), files);
    let server = HubServer::start(state);
    let cache = dir.join("cache");
    let err = hub(&server, &cache).pull(&name("test/odd")).unwrap_err();
    assert!(matches!(err, HubError::Unsupported(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("architecture 'gpt-j' is not supported"),
        "{err}"
    );
    // Only range reads of the header, no download; nothing cached.
    let requests = server.requests("odd.gguf");
    assert!(!requests.is_empty());
    let header_read = |r: &Option<String>| r.as_deref().is_some_and(|r| !r.ends_with('-'));
    assert!(requests.iter().all(header_read), "{requests:?}");
    assert!(
        !cache.join("models--test--odd").join("blobs").exists()
            || tree(&cache.join("models--test--odd").join("blobs")).is_empty()
    );
}

fn hf_repo(dir: &Path, edit: &dyn Fn(String) -> String) -> BTreeMap<String, HubFile> {
    let model = dir.join("model");
    write_hf(&model, &SynthSpec::tiny(Arch::Llama, Format::F32, 3)).unwrap();
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(&model).unwrap().flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let mut bytes = std::fs::read(entry.path()).unwrap();
        if file == "config.json" {
            bytes = edit(String::from_utf8(bytes).unwrap()).into_bytes();
        }
        let lfs = file.ends_with(".safetensors");
        files.insert(
            file,
            if lfs {
                HubFile::lfs(bytes)
            } else {
                HubFile::small(bytes)
            },
        );
    }
    files
}

#[test]
fn a_safetensors_repository_becomes_a_model_directory() {
    let dir = scratch("directory");
    let mut state = HubState::default();
    state
        .repos
        .insert("test/tiny".into(), hf_repo(&dir, &|c| c));
    let server = HubServer::start(state);
    let cache = dir.join("cache");
    let path = hub(&server, &cache).pull(&name("test/tiny")).unwrap();
    assert_eq!(
        path,
        cache.join("models--test--tiny/snapshots").join(COMMIT)
    );
    let info = tensorfold_models::inspect(&path).unwrap();
    assert_eq!(info.layout, "huggingface");
    let listed = hub(&server, &cache).list();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "test/tiny");
    hub(&server, &cache).remove(&name("test/tiny")).unwrap();
    assert!(!cache.join("models--test--tiny").exists());
}

#[test]
fn an_unsupported_directory_is_refused_before_its_weights() {
    let dir = scratch("refuse-directory");
    let mut state = HubState::default();
    let edit = |c: String| c.replace("LlamaForCausalLM", "MambaForCausalLM");
    state
        .repos
        .insert("test/mamba".into(), hf_repo(&dir, &edit));
    let server = HubServer::start(state);
    let err = hub(&server, &dir.join("cache"))
        .pull(&name("test/mamba"))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("architecture 'MambaForCausalLM' is not supported"),
        "{err}"
    );
    let weights = server.requests("model.safetensors");
    let header_read = |r: &Option<String>| r.as_deref().is_some_and(|r| !r.ends_with('-'));
    assert!(
        !weights.is_empty() && weights.iter().all(header_read),
        "only header ranges: {weights:?}"
    );
}

#[test]
fn a_missing_repository_or_quant_is_a_clear_error() {
    let dir = scratch("missing");
    let mut state = HubState::default();
    state.repos.insert("test/tiny-GGUF".into(), gguf_repo(&dir));
    let server = HubServer::start(state);
    let hub = hub(&server, &dir.join("cache"));
    let err = hub.pull(&name("test/nothing")).unwrap_err();
    assert!(matches!(err, HubError::NotFound(_)), "{err:?}");
    let err = hub.pull(&name("test/tiny-GGUF:Q6_K")).unwrap_err();
    assert!(
        err.to_string().contains("tiny-Q4_0.gguf, tiny-Q8_0.gguf"),
        "{err}"
    );
    let err = hub.pull(&name("test/tiny-GGUF")).unwrap_err();
    assert!(
        err.to_string().contains("name one as test/tiny-GGUF:QUANT"),
        "{err}"
    );
}
