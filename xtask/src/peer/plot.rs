//! The plot: aggregate tokens/s against concurrent streams, both engines,
//! one panel per model, greedy and sampled.

use super::report::Report;
use anyhow::{anyhow, bail, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::Path;

/// Fonts tried, in order; the plot needs one for its labels.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

fn register_font() -> Result<()> {
    let Some(bytes) = FONTS.iter().find_map(|p| std::fs::read(p).ok()) else {
        bail!("no font found for the plot's labels (install fonts-dejavu-core)");
    };
    // Plotters keeps fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("the font could not be read"))
}

/// Writes `report`'s serving levels as a PNG.
pub fn write(report: &Report, path: &Path) -> Result<()> {
    register_font()?;
    let panels: Vec<_> = report
        .models
        .iter()
        .filter(|m| m.engines.iter().any(|e| !e.serving.is_empty()))
        .collect();
    if panels.is_empty() {
        bail!("no serving levels to plot");
    }
    let root = BitMapBackend::new(path, (900, 420 * panels.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let areas = root.split_evenly((panels.len(), 1));
    let colors = [RGBColor(200, 80, 40), RGBColor(30, 100, 200)];
    for (model, area) in panels.iter().zip(&areas) {
        let levels = model
            .engines
            .iter()
            .flat_map(|e| e.serving.values().flatten());
        let top = levels
            .clone()
            .map(|l| l.aggregate_tokens_per_s)
            .fold(1.0, f64::max);
        let most = levels.map(|l| l.streams).max().unwrap_or(1).max(2) as f64;
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{}: aggregate tokens/s ({})", model.name, report.backend),
                ("sans-serif", 20),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..most.log2(), 0f64..top * 1.1)
            .map_err(draw_error)?;
        chart
            .configure_mesh()
            .x_desc("concurrent streams")
            .y_desc("tokens/s")
            .x_labels(most.log2() as usize + 1)
            .x_label_formatter(&|x| format!("{:.0}", x.exp2()))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(draw_error)?;
        for (engine, color) in model.engines.iter().zip(colors) {
            for (mode, levels) in &engine.serving {
                let points: Vec<(f64, f64)> = levels
                    .iter()
                    .filter(|l| l.failed < l.streams)
                    .map(|l| ((l.streams as f64).log2(), l.aggregate_tokens_per_s))
                    .collect();
                // Sampled lines are dashed: where both modes give the same
                // rate, the greedy line must not hide the sampled one.
                let (style, series) = if mode == "greedy" {
                    let style = color.stroke_width(3);
                    let line = LineSeries::new(points.clone(), style);
                    (style, chart.draw_series(line))
                } else {
                    let style = color.mix(0.6).stroke_width(2);
                    let line = DashedLineSeries::new(points.clone(), 8, 5, style);
                    (style, chart.draw_series(line))
                };
                series
                    .map_err(draw_error)?
                    .label(format!("{} {mode}", engine.engine))
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], style));
                chart
                    .draw_series(
                        points
                            .into_iter()
                            .map(|p| Circle::new(p, 4, style.filled())),
                    )
                    .map_err(draw_error)?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(draw_error)?;
    }
    root.present().map_err(draw_error)?;
    Ok(())
}

fn draw_error<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the plot: {e:?}")
}
