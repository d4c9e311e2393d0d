//! The SVG chart: throughput and lock requests per critical section against T, one
//! row per workload.

use std::path::Path;

use super::targets::find;
use super::{Point, Report};
use crate::config::{Config, Mode};

pub(super) fn chart(
    cfg: &Config,
    r: &Report,
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;

    let colors = |m: Mode| match m {
        Mode::Naive => RGBColor(214, 39, 40),
        Mode::Coalesced => RGBColor(31, 119, 180),
        Mode::Handoff => RGBColor(44, 160, 44),
        Mode::Default => RGBColor(44, 160, 44),
        Mode::Cached => RGBColor(148, 103, 189),
        Mode::Uncached => RGBColor(140, 86, 75),
        Mode::Plain => RGBColor(255, 127, 14),
        Mode::Floor => RGBColor(100, 100, 100),
    };
    let rows = cfg.workloads.len();
    let root = SVGBackend::new(path, (1200, 360 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((rows, 2));
    let tmin = *cfg.tasks.iter().min().unwrap_or(&1) as f64;
    let tmax = *cfg.tasks.iter().max().unwrap_or(&1) as f64;
    let x_range = (tmin * 0.8)..(tmax * 1.25);
    for (row, &w) in cfg.workloads.iter().enumerate() {
        let series = |m: Mode, f: &dyn Fn(&Point) -> f64| -> Vec<(f64, f64)> {
            cfg.tasks
                .iter()
                .filter_map(|&t| find(&r.points, w, m, t).map(|p| (t as f64, f(p))))
                .collect()
        };
        // Throughput.
        let ymax = r
            .points
            .iter()
            .filter(|p| p.workload == w)
            .map(|p| p.throughput)
            .fold(1.0, f64::max)
            * 1.6; // room for the legend above the lines
        let mut c = ChartBuilder::on(&areas[row * 2])
            .caption(
                format!("{}: critical sections / s (P={})", w.name(), cfg.procs),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(x_range.clone().log_scale(), 0.0..ymax)?;
        c.configure_mesh()
            .x_desc("T (tasks per process)")
            .y_desc("cs/s")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for &m in &cfg.modes {
            let pts = series(m, &|p| p.throughput);
            let col = colors(m);
            let label = if m == Mode::Floor {
                "floor (tokio Mutex, 1 process, P·T tasks)".to_owned()
            } else {
                m.name().to_owned()
            };
            c.draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col));
            c.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, col.filled())))?;
        }
        c.configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
        // Requests per critical section (log).
        let vals: Vec<f64> = r
            .points
            .iter()
            .filter(|p| p.workload == w && p.mode != Mode::Floor)
            .map(|p| p.requests_per_cs())
            .filter(|v| *v > 0.0)
            .collect();
        let lo = vals.iter().copied().fold(f64::MAX, f64::min).min(0.1) / 2.0;
        let hi = vals.iter().copied().fold(1.0, f64::max) * 2.0;
        let mut c = ChartBuilder::on(&areas[row * 2 + 1])
            .caption(
                format!("{}: Redis lock requests / critical section", w.name()),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(x_range.clone().log_scale(), (lo..hi).log_scale())?;
        c.configure_mesh()
            .x_desc("T (tasks per process)")
            .y_desc("requests / cs")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.3}"))
            .draw()?;
        for &m in cfg.modes.iter().filter(|&&m| m != Mode::Floor) {
            let pts: Vec<(f64, f64)> = series(m, &|p| p.requests_per_cs())
                .into_iter()
                .filter(|p| p.1 > 0.0)
                .collect();
            let col = colors(m);
            c.draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))?
                .label(m.name())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col));
            c.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, col.filled())))?;
        }
        c.configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
