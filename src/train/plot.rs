//! The picture of a run: `metrics.jsonl` read back into series and drawn as one PNG with a panel
//! each for loss (training and eval), learning rate and GPU memory.

use std::fs::File;
use std::io::BufWriter;
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::Context;
use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Deserialize;

/// One logged optimizer step, as far as the plot needs it (null or absent values are `None`).
#[derive(Debug, Clone, PartialEq)]
pub struct StepPoint {
    pub step: usize,
    pub loss: Option<f64>,
    pub lr: Option<f64>,
    pub gpu_allocated_gib: Option<f64>,
    pub gpu_peak_gib: Option<f64>,
}

/// A run's metrics in step order, with what a resume overwrote already dropped.
#[derive(Debug, Default, PartialEq)]
pub struct RunMetrics {
    pub steps: Vec<StepPoint>,
    /// (step, eval loss).
    pub evals: Vec<(usize, f64)>,
    /// Lines that are not JSON: the torn last write of a killed run.
    pub unreadable_lines: usize,
}

/// Any line of metrics.jsonl; keys the plot does not use are ignored. `trained_tokens` is on every
/// step record and `eval_tokens` on every eval record, and neither is ever null.
#[derive(Deserialize)]
struct Line {
    step: usize,
    loss: Option<f64>,
    lr: Option<f64>,
    gpu_allocated_gib: Option<f64>,
    gpu_peak_gib: Option<f64>,
    trained_tokens: Option<usize>,
    eval_loss: Option<f64>,
    eval_tokens: Option<usize>,
}

impl RunMetrics {
    /// Reads `path`, skipping lines that do not parse (a kill mid-write tears the last one).
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        // a torn write can end inside a multi-byte character
        let text = String::from_utf8_lossy(&bytes);
        let mut metrics = RunMetrics::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match serde_json::from_str::<Line>(line) {
                Ok(line) => metrics.push(line),
                Err(_) => metrics.unreadable_lines += 1,
            }
        }
        anyhow::ensure!(!metrics.steps.is_empty(), "no step records in {}", path.display());
        Ok(metrics)
    }

    /// A resumed run goes back to its checkpoint and logs from there again, so a record for step
    /// s replaces everything logged at s or later: the later line wins. An eval at s is measured
    /// after step s, so it keeps step s itself.
    fn push(&mut self, line: Line) {
        let s = line.step;
        // both lists are in step order: dropping what is at or past s is a truncation
        let (is_eval, is_step) = (line.eval_tokens.is_some(), line.trained_tokens.is_some());
        if is_eval || is_step {
            self.evals.truncate(self.evals.partition_point(|&(step, _)| step < s));
        }
        if is_eval {
            self.steps.truncate(self.steps.partition_point(|p| p.step <= s));
            self.evals.extend(line.eval_loss.map(|loss| (s, loss)));
        } else if is_step {
            self.steps.truncate(self.steps.partition_point(|p| p.step < s));
            self.steps.push(StepPoint {
                step: s,
                loss: line.loss,
                lr: line.lr,
                gpu_allocated_gib: line.gpu_allocated_gib,
                gpu_peak_gib: line.gpu_peak_gib,
            });
        }
    }
}

/// `lora-ft plot RUN_DIR [--out FILE]`: `RUN_DIR/metrics.jsonl` drawn into `out`
/// (`RUN_DIR/metrics.png` by default). Returns the file written.
pub fn plot_run(run_dir: &Path, out: Option<&Path>) -> anyhow::Result<PathBuf> {
    let metrics = RunMetrics::read(&run_dir.join("metrics.jsonl"))?;
    if metrics.unreadable_lines > 0 {
        tracing::warn!(
            "{}: skipped {} unreadable line(s) (a run killed mid-write)",
            run_dir.join("metrics.jsonl").display(),
            metrics.unreadable_lines
        );
    }
    let out = out.map_or_else(|| run_dir.join("metrics.png"), Path::to_path_buf);
    let name = std::fs::canonicalize(run_dir).ok().and_then(|p| p.file_name().map(|n| n.to_owned()));
    let name = name.map_or_else(|| run_dir.display().to_string(), |n| n.to_string_lossy().into_owned());
    write_png(&metrics, &format!("lora-ft run {name}"), &out)?;
    Ok(out)
}

/// One panel: a y-axis description and its named series of (step, value).
struct Panel {
    y_desc: &'static str,
    /// Quantities read against zero (memory against the card, the learning rate's warmup).
    from_zero: bool,
    /// Where the curves usually are not: a falling loss leaves the upper right empty, memory
    /// drawn from zero the lower right.
    legend: SeriesLabelPosition,
    series: Vec<(&'static str, Vec<(f64, f64)>)>,
}

const WIDTH: u32 = 1000;
const TITLE_HEIGHT: u32 = 50;
const PANEL_HEIGHT: u32 = 300;
const BLUE: RGBColor = RGBColor(31, 119, 180);
const ORANGE: RGBColor = RGBColor(255, 127, 14);

/// The panels that have data, in reading order: loss, learning rate, GPU memory.
fn panels(metrics: &RunMetrics) -> Vec<Panel> {
    let of = |value: fn(&StepPoint) -> Option<f64>| -> Vec<(f64, f64)> {
        metrics.steps.iter().filter_map(|p| Some((p.step as f64, value(p)?))).collect()
    };
    let evals = metrics.evals.iter().map(|&(s, loss)| (s as f64, loss)).collect();
    let all = [
        Panel {
            y_desc: "loss (nats/token)",
            from_zero: false,
            legend: SeriesLabelPosition::UpperRight,
            series: vec![("train", of(|p| p.loss)), ("eval", evals)],
        },
        Panel {
            y_desc: "learning rate",
            from_zero: true,
            legend: SeriesLabelPosition::UpperRight,
            series: vec![("lr", of(|p| p.lr))],
        },
        Panel {
            y_desc: "GPU memory (GiB)",
            from_zero: true,
            legend: SeriesLabelPosition::LowerRight,
            series: vec![("allocated", of(|p| p.gpu_allocated_gib)), ("peak", of(|p| p.gpu_peak_gib))],
        },
    ];
    all.into_iter()
        .map(|mut panel| {
            for (_, points) in &mut panel.series {
                points.retain(|(_, v)| v.is_finite());
            }
            panel.series.retain(|(_, points)| !points.is_empty());
            panel
        })
        .filter(|panel| !panel.series.is_empty())
        .collect()
}

/// Draws `metrics` under `title` and writes the PNG to `out`.
pub fn write_png(metrics: &RunMetrics, title: &str, out: &Path) -> anyhow::Result<()> {
    register_font()?;
    let panels = panels(metrics);
    anyhow::ensure!(!panels.is_empty(), "no finite loss, learning rate or memory values to plot");
    let (width, height) = (WIDTH, TITLE_HEIGHT + PANEL_HEIGHT * panels.len() as u32);
    let mut rgb = vec![0u8; (width * height * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        let root = root.titled(title, ("sans-serif", 26)).map_err(draw_error)?;
        // the eval before training sits at the resume step, left of the first logged step
        let all = metrics.steps.iter().map(|p| p.step).chain(metrics.evals.iter().map(|&(s, _)| s));
        let (lo, hi) = all.fold((usize::MAX, 0), |(lo, hi), s| (lo.min(s), hi.max(s)));
        let steps = padded(lo as f64, hi as f64);
        for (panel, area) in panels.iter().zip(root.split_evenly((panels.len(), 1))) {
            draw_panel(&area, panel, steps.clone())?;
        }
        root.present().map_err(draw_error)?;
    }
    encode_png(&rgb, (width, height), out)
}

fn draw_panel(
    area: &DrawingArea<BitMapBackend, Shift>,
    panel: &Panel,
    steps: Range<f64>,
) -> anyhow::Result<()> {
    let values = panel.series.iter().flat_map(|(_, points)| points.iter().map(|&(_, v)| v));
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let lo = if panel.from_zero { lo.min(0.0) } else { lo };
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(steps, padded(lo, hi))
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("optimizer step")
        .y_desc(panel.y_desc)
        .x_label_formatter(&|x| if x.fract() == 0.0 { format!("{x:.0}") } else { String::new() })
        .y_label_formatter(&|y| tick(*y))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(draw_error)?;
    for ((name, points), color) in panel.series.iter().zip([BLUE, ORANGE]) {
        // a lone point is no line: mark it; eval points are always marked, being few
        let marked = points.len() == 1 || *name == "eval";
        let line = LineSeries::new(points.iter().copied(), color.stroke_width(2));
        chart
            .draw_series(line.point_size(if marked { 4 } else { 0 }))
            .map_err(draw_error)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    if panel.series.len() > 1 {
        chart
            .configure_series_labels()
            .position(panel.legend.clone())
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(draw_error)?;
    }
    Ok(())
}

/// `lo..hi` widened by 5% each side, and never empty (a single step, a constant learning rate).
fn padded(lo: f64, hi: f64) -> Range<f64> {
    let pad = (hi - lo) * 0.05;
    let pad = match (pad, hi.abs().max(lo.abs()) * 0.1) {
        (pad, _) if pad.is_normal() => pad,
        (_, tenth) if tenth.is_normal() => tenth,
        _ => 1.0,
    };
    let range = (lo - pad)..(hi + pad);
    if range.start < range.end && range.start.is_finite() && range.end.is_finite() {
        range
    } else {
        (lo - 1.0)..(hi + 1.0)
    }
}

/// Learning rates are 1e-4-ish and losses 0.1–10: scientific notation only where it is needed.
fn tick(v: f64) -> String {
    if v != 0.0 && !(0.01..10_000.0).contains(&v.abs()) {
        format!("{v:.1e}")
    } else {
        format!("{v:.3}").trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Label text needs a font and CI machines have none installed, so Noto Sans (Apache-2.0, from
/// the ttf-noto-sans crate) is compiled in and registered as plotters' "sans-serif".
fn register_font() -> anyhow::Result<()> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, ttf_noto_sans::REGULAR).is_ok()
    });
    anyhow::ensure!(ok, "the embedded Noto Sans font did not load");
    Ok(())
}

fn encode_png(rgb: &[u8], (width, height): (u32, u32), out: &Path) -> anyhow::Result<()> {
    let file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut encoder = png::Encoder::new(BufWriter::new(file), width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().with_context(|| format!("writing {}", out.display()))?;
    writer.write_image_data(rgb).with_context(|| format!("writing {}", out.display()))?;
    writer.finish().with_context(|| format!("writing {}", out.display()))
}

/// plotters' drawing errors borrow the backend's error type; keep the message only.
fn draw_error<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow::anyhow!("drawing the plot: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step_line(step: usize, loss: f64) -> String {
        format!(
            r#"{{"step":{step},"epoch":0.5,"loss":{loss},"lr":{},"grad_norm":1.0,"loss_scale":1.0,"skipped_steps":0,"trained_tokens":90,"tokens":128,"tokens_per_s":500.0,"elapsed_s":{step}.0,"gpu_allocated_gib":1.5,"gpu_peak_gib":{},"future_key":[1,2]}}"#,
            1e-4 * step as f64,
            2.0 + step as f64 / 10.0
        )
    }

    fn eval_line(step: usize, loss: f64) -> String {
        format!(r#"{{"step":{step},"eval_loss":{loss},"eval_ppl":{},"eval_tokens":400}}"#, loss.exp())
    }

    fn write_metrics(name: &str, lines: &[String], tail: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lora-ft-plot-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(dir.join("metrics.jsonl"), text + tail).unwrap();
        dir
    }

    /// Steps 1–6 and evals 0, 2, 4, 6 logged, killed, resumed from step 4's checkpoint (which
    /// evaluates at 4 again) and relogged 5–6 with other losses, then killed mid-write.
    fn resumed_run() -> Vec<String> {
        let mut lines = vec![eval_line(0, 3.0)];
        for s in 1..=6 {
            lines.push(step_line(s, 3.0 - s as f64 / 10.0));
            if s % 2 == 0 {
                lines.push(eval_line(s, 3.1 - s as f64 / 10.0));
            }
        }
        lines.push(eval_line(4, 2.75));
        lines.extend([step_line(5, 2.45), step_line(6, 2.35), eval_line(6, 2.55), step_line(7, 2.25)]);
        lines
    }

    #[test]
    fn resumed_steps_are_replaced_by_the_later_lines_and_a_torn_line_is_skipped() {
        let dir = write_metrics("resumed", &resumed_run(), r#"{"step":8,"epoch":0.9,"lo"#);
        let m = RunMetrics::read(&dir.join("metrics.jsonl")).unwrap();
        let steps: Vec<(usize, Option<f64>)> = m.steps.iter().map(|p| (p.step, p.loss)).collect();
        let expected = [(1, 2.9), (2, 2.8), (3, 2.7), (4, 2.6), (5, 2.45), (6, 2.35), (7, 2.25)];
        assert_eq!(steps, expected.map(|(s, l)| (s, Some(l))));
        assert_eq!(m.evals, [(0, 3.0), (2, 2.9), (4, 2.75), (6, 2.55)]);
        assert_eq!(m.unreadable_lines, 1);
        let last = m.steps.last().unwrap();
        assert_eq!((last.lr, last.gpu_allocated_gib, last.gpu_peak_gib), (Some(7e-4), Some(1.5), Some(2.7)));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_file_without_step_records_is_an_error_naming_it() {
        for (name, tail) in [
            ("empty", ""),
            ("eval-only", "{\"step\":0,\"eval_loss\":3.0,\"eval_ppl\":20.0,\"eval_tokens\":9}\n"),
        ] {
            let dir = write_metrics(name, &[], tail);
            let path = dir.join("metrics.jsonl");
            let err = plot_run(&dir, None).unwrap_err();
            assert_eq!(format!("{err:#}"), format!("no step records in {}", path.display()));
            assert!(!dir.join("metrics.png").exists());
            std::fs::remove_dir_all(dir).unwrap();
        }
    }

    /// Decodes `path` and returns its size and number of distinct colours.
    fn decode(path: &Path) -> ((u32, u32), usize) {
        let mut reader =
            png::Decoder::new(std::io::BufReader::new(File::open(path).unwrap())).read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgb);
        let colours: std::collections::HashSet<&[u8]> = buf[..info.buffer_size()].chunks(3).collect();
        ((info.width, info.height), colours.len())
    }

    #[test]
    fn the_png_has_a_panel_per_kind_of_data_and_is_drawn_on() {
        let dir = write_metrics("png", &resumed_run(), "");
        let out = plot_run(&dir, None).unwrap();
        assert_eq!(out, dir.join("metrics.png"));
        let (size, colours) = decode(&out);
        // loss, learning rate, GPU memory
        assert_eq!(size, (WIDTH, TITLE_HEIGHT + 3 * PANEL_HEIGHT));
        // white, black text and axes, two series colours and their anti-aliased edges
        assert!(colours > 20, "{colours} colours");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_single_cpu_step_still_makes_a_png_without_the_memory_panel() {
        let line = r#"{"step":1,"loss":2.5,"lr":0.0,"trained_tokens":10,"grad_norm":null}"#;
        let dir = write_metrics("single", &[line.to_string()], "");
        let out = dir.join("single.png");
        assert_eq!(plot_run(&dir, Some(&out)).unwrap(), out);
        let (size, colours) = decode(&out);
        assert_eq!(size, (WIDTH, TITLE_HEIGHT + 2 * PANEL_HEIGHT));
        assert!(colours > 20, "{colours} colours");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn ticks_are_short() {
        let ticks = [0.0, 2.5, 3.0, 0.125, 2e-4, 12_000.0].map(tick);
        assert_eq!(ticks, ["0", "2.5", "3", "0.125", "2.0e-4", "1.2e4"]);
    }

    #[test]
    fn axis_ranges_are_never_empty() {
        for (lo, hi) in [(5.0, 5.0), (0.0, 0.0), (1e-300, 1e-300), (-f64::MAX, f64::MAX), (1.0, 2.0)] {
            let r = padded(lo, hi);
            assert!(r.start < r.end && r.start <= lo && r.end >= hi, "{lo}..{hi} → {r:?}");
        }
    }
}
