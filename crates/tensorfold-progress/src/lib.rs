//! Progress of long operations (downloads, model loads, quantization): an
//! `indicatif` bar on stderr when it is a terminal, otherwise a plain line at
//! the start, at every tenth of the way and at the end, so logs and CI output
//! stay readable.

use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// What the bar counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    Items,
}

/// One long operation's progress. Cheap to update from a hot loop: plain
/// lines are written only when a new tenth is reached.
pub struct Progress {
    label: String,
    unit: Unit,
    total: AtomicU64,
    position: AtomicU64,
    /// The last tenth a plain line was written for.
    tenth: AtomicU64,
    start: Instant,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar of `total` units (0 when unknown: a spinner in a terminal).
    pub fn new(label: impl Into<String>, unit: Unit, total: u64) -> Progress {
        Progress::with_terminal(label, unit, total, std::io::stderr().is_terminal())
    }

    /// As [`Progress::new`], choosing the display explicitly (tests).
    pub fn with_terminal(
        label: impl Into<String>,
        unit: Unit,
        total: u64,
        terminal: bool,
    ) -> Progress {
        let label = label.into();
        let bar = terminal.then(|| {
            let bar = ProgressBar::new(total);
            bar.set_style(style(unit, total));
            bar.set_message(label.clone());
            bar.enable_steady_tick(std::time::Duration::from_millis(100));
            bar
        });
        let progress = Progress {
            label,
            unit,
            total: AtomicU64::new(total),
            position: AtomicU64::new(0),
            tenth: AtomicU64::new(0),
            start: Instant::now(),
            bar,
        };
        if progress.bar.is_none() {
            eprintln!("{}: started{}", progress.label, progress.of_total());
        }
        progress
    }

    /// A spinner for an operation of unknown length.
    pub fn spinner(label: impl Into<String>) -> Progress {
        Progress::new(label, Unit::Items, 0)
    }

    /// Sets a total learnt after the start.
    pub fn set_total(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
        if let Some(bar) = &self.bar {
            bar.set_style(style(self.unit, total));
            bar.set_length(total);
        }
    }

    /// Moves to `position` units done.
    pub fn set(&self, position: u64) {
        self.position.store(position, Ordering::Relaxed);
        match &self.bar {
            Some(bar) => bar.set_position(position),
            None => self.plain_line(position),
        }
    }

    /// Adds `units` done.
    pub fn inc(&self, units: u64) {
        let position = self.position.fetch_add(units, Ordering::Relaxed) + units;
        match &self.bar {
            Some(bar) => bar.set_position(position),
            None => self.plain_line(position),
        }
    }

    /// Writes a line without breaking the bar.
    pub fn note(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// Ends the operation with a closing line (`note` is appended to it).
    pub fn finish(self, note: &str) {
        let position = self.position.load(Ordering::Relaxed);
        let amount = match self.total.load(Ordering::Relaxed) {
            0 => String::new(),
            _ => format!("{} ", self.amount(position)),
        };
        let line = format!(
            "{}: done, {amount}in {:.1}s{}{note}",
            self.label,
            self.start.elapsed().as_secs_f64(),
            if note.is_empty() { "" } else { ", " },
        );
        match &self.bar {
            Some(bar) => bar.finish_with_message(line),
            None => eprintln!("{line}"),
        }
    }

    /// Ends a failed operation, leaving the bar where it stopped.
    pub fn abandon(self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
    }

    fn plain_line(&self, position: u64) {
        let total = self.total.load(Ordering::Relaxed);
        if total == 0 {
            return;
        }
        let tenth = (position.min(total) * 10 / total).min(10);
        let last = self.tenth.load(Ordering::Relaxed);
        if tenth > last
            && tenth < 10
            && self
                .tenth
                .compare_exchange(last, tenth, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            eprintln!(
                "{}: {}% ({} of {})",
                self.label,
                tenth * 10,
                self.amount(position),
                self.amount(total)
            );
        }
    }

    fn of_total(&self) -> String {
        match self.total.load(Ordering::Relaxed) {
            0 => String::new(),
            total => format!(" ({})", self.amount(total)),
        }
    }

    fn amount(&self, units: u64) -> String {
        match self.unit {
            Unit::Bytes => HumanBytes(units).to_string(),
            Unit::Items => units.to_string(),
        }
    }
}

fn style(unit: Unit, total: u64) -> ProgressStyle {
    let template = match (unit, total) {
        (_, 0) => "{spinner} {msg} [{elapsed}]",
        (Unit::Bytes, _) => {
            "{msg} [{elapsed}] [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})"
        }
        (Unit::Items, _) => "{msg} [{elapsed}] [{wide_bar}] {pos}/{len} ({eta})",
    };
    ProgressStyle::with_template(template)
        .expect("a valid template")
        .progress_chars("=> ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_mark_each_tenth_once() {
        let p = Progress::with_terminal("x", Unit::Bytes, 100, false);
        for i in 0..=100 {
            p.set(i);
        }
        assert_eq!(p.tenth.load(Ordering::Relaxed), 9);
        p.finish("");
    }
}
