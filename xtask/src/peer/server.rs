//! A server process for the serving cells: started, waited on until it
//! answers `/health`, and stopped when dropped.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    pub url: String,
}

impl Server {
    /// Starts `command` (which must listen on `port`), its output going to
    /// `log`; returns once `/health` answers 200, or fails after `wait`.
    pub fn start(mut command: Command, port: u16, log: &Path, wait: Duration) -> Result<Server> {
        let out = std::fs::File::create(log).with_context(|| format!("creating {log:?}"))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {:?}", command.get_program()))?;
        let mut server = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let started = Instant::now();
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(2))
            .build();
        loop {
            if let Some(status) = server.child.try_wait()? {
                bail!("server exited ({status}) before it answered; see {log:?}");
            }
            if let Ok(response) = agent.get(&format!("{}/health", server.url)).call() {
                if response.status() == 200 {
                    return Ok(server);
                }
            }
            if started.elapsed() > wait {
                bail!("server did not answer /health in {wait:?}; see {log:?}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Server {
    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on now.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
