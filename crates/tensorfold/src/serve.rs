//! `tensorfold serve`.

use crate::cli::ServeArgs;
use crate::run::{load_engine, sampling};
use anyhow::{Context, Result};
use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tensorfold_server::{Metrics, ServerConfig};

pub fn serve(args: ServeArgs) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let (model, hub_name) = match &args.model {
        Some(p) => crate::hub::resolve(p)?,
        None => {
            let dir = tensorfold_registry::models_dir();
            tracing::info!(
                "no model given: using the default model in {}",
                dir.display()
            );
            let path =
                tensorfold_registry::fetch_default(&dir).context("fetching the default model")?;
            (path, None)
        }
    };
    let mut engine = load_engine(&model, &args.draft, args.backend, None)?;
    engine.set_parallel(args.parallel)?;
    engine.set_decode_share(args.decode_share)?;
    engine.set_context(args.context)?;
    if let Some(g) = args.prompt_cache_gib {
        anyhow::ensure!(
            g >= 0.0 && g.is_finite(),
            "--prompt-cache-gib takes a non-negative number"
        );
    }
    let retained = args
        .prompt_cache_gib
        .map(|g| (g * (1u64 << 30) as f64) as usize);
    engine.set_prompt_cache(retained, args.checkpoint_slots);
    if let Some(path) = &args.chat_template_file {
        let source =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        engine.set_chat_template(&source)?;
    }
    let memory = engine.memory();
    let per_stream = tensorfold_engine::memory::Bytes(memory.stream_bytes(engine.window()));
    eprintln!(
        "{}: context window {} tokens ({}); memory budget {} ({} fixed, {} per full-window stream); up to {} streams",
        engine.backend(),
        engine.window(),
        if args.context.is_some() { "--context" } else { "largest that fits" },
        tensorfold_engine::memory::Bytes(memory.limit),
        tensorfold_engine::memory::Bytes(memory.fixed),
        per_stream,
        engine.max_streams(),
    );
    let name = args
        .name
        .clone()
        .or(hub_name)
        .unwrap_or_else(|| engine.bundle().name.clone());
    let mut config = ServerConfig::new(&name);
    config.max_tokens = args.max_tokens;
    config.sampling = sampling(&args.sampling, &engine.bundle().defaults);
    config.api_key = args.api_key.clone();
    config.max_body_bytes = args.max_body_bytes;
    config.queue = args.queue;
    config.stored_responses = args.stored_responses;
    let window = engine.window();
    let drafter = engine.drafter();
    let (app, metrics) = tensorfold_server::router(engine, config);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        tracing::info!(model = %name, window, drafter = ?drafter, "listening on http://{addr}");
        if std::io::stderr().is_terminal() {
            tokio::spawn(live_line(metrics));
        }
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown())
            .await?;
        Ok(())
    })
}

async fn shutdown() {
    let _ = tokio::signal::ctrl_c().await;
}

/// One status line, rewritten in place: throughput, queue, memory.
async fn live_line(m: Arc<Metrics>) {
    let mut last = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let now = m.completion_tokens_live.load(Ordering::Relaxed);
        eprint!(
            "\r\x1b[2K{:>6} tok/s | running {} | queued {} | {} requests | {:.0} MiB",
            now.saturating_sub(last),
            m.running.load(Ordering::Relaxed),
            m.queued.load(Ordering::Relaxed),
            m.requests.load(Ordering::Relaxed),
            tensorfold_server::rss_bytes() as f64 / (1 << 20) as f64
        );
        last = now;
    }
}
