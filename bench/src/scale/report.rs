//! The curves' Markdown tables and SVG charts.

use std::fmt::Write as _;
use std::path::Path;

use super::Curves;

fn mib(bytes: f64) -> String {
    format!("{:.1}", bytes / (1024.0 * 1024.0))
}

/// The tables, one per curve that ran.
pub fn markdown(c: &Curves) -> String {
    let mut s = String::new();
    if !c.keys.is_empty() {
        let _ = writeln!(
            s,
            "#### Distinct keys (64 tasks, each key locked and released once; a second pass over N other keys)\n\n\
             | N | sections/s | RSS before (MiB) | after pass 1 | after pass 2 | keys in use | lock names left | Redis before (MiB) | right after | settled | DBSIZE after | release records after | DBSIZE settled | no record after (s) |\n\
             |--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
        );
        for r in &c.keys {
            let _ = writeln!(
                s,
                "| {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.n,
                r.throughput,
                mib(r.rss_before as f64),
                mib(r.rss_after as f64),
                mib(r.rss_after_second as f64),
                r.keys_in_use,
                r.lock_names_left,
                mib(r.redis_before as f64),
                mib(r.redis_after as f64),
                mib(r.redis_settled as f64),
                r.dbsize_after,
                r.records_after,
                r.dbsize_settled,
                r.settle_secs.map_or("-".to_owned(), |t| format!("{t:.1}")),
            );
        }
        s.push('\n');
    }
    if !c.waiters.is_empty() {
        let _ = writeln!(
            s,
            "#### Local waiters (T tasks on one key behind a holder of the same process)\n\n\
             | T | RSS / waiter (bytes) | µs / section after the release | handoffs | Redis acquires | cancel all (ms) | cancel µs / waiter | RSS left after cancel (KiB) | handoffs after cancel | relock at once | keys in use |\n\
             |--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|--:|"
        );
        for r in &c.waiters {
            let _ = writeln!(
                s,
                "| {} | {:.0} | {:.1} | {} | {} | {:.2} | {:.2} | {} | {} | {} | {} |",
                r.t,
                r.bytes_per_waiter,
                r.us_per_section,
                r.handoffs,
                r.acquired,
                r.cancel_ms,
                r.cancel_ms * 1e3 / r.t as f64,
                r.rss_residue_after_cancel / 1024,
                r.handoffs_after_cancel,
                if r.relock_at_once { "yes" } else { "no" },
                r.keys_in_use,
            );
        }
        s.push('\n');
    }
    if !c.held.is_empty() {
        let _ = writeln!(
            s,
            "#### Held leases (per renewal period: interval + scan tick, 1.25 s at a 3 s TTL)\n\n\
             | N | TTL (s) | RSS / lease (bytes) | Redis / lease (bytes) | EVALSHA / period | renewal requests / period | Redis CPU ms / period | client CPU ms / period | leases lost |\n\
             |--:|--:|--:|--:|--:|--:|--:|--:|--:|"
        );
        for r in &c.held {
            let _ = writeln!(
                s,
                "| {} | {} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
                r.n,
                r.ttl.as_secs_f64(),
                r.rss_per_lease,
                r.redis_per_lease,
                r.evalsha_per_period,
                r.renewals_per_period,
                r.redis_cpu_ms_per_period,
                r.client_cpu_ms_per_period,
                r.lost,
            );
        }
        s.push('\n');
    }
    if !c.instances.is_empty() {
        let _ = writeln!(
            s,
            "#### Instances (P instances × 2 tasks, one hot key)\n\n\
             | P | sections/s | Redis releases / section | Redis commands / section | Redis commands / release | PUBLISH / release | EVALSHA / release | Redis queue, mean (max) | shares, min–max | wait p99 |\n\
             |--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
        );
        for r in &c.instances {
            let _ = writeln!(
                s,
                "| {} | {:.0} | {:.3} | {:.2} | {:.2} | {:.3} | {:.2} | {:.2} ({}) | {:.0}–{:.0} % | {:.2} ms |",
                r.p,
                r.throughput,
                r.releases_per_cs,
                r.commands_per_cs,
                r.commands_per_release,
                r.publish_per_release,
                r.evalsha_per_release,
                r.queue_mean,
                r.queue_max,
                r.share_min * 100.0,
                r.share_max * 100.0,
                r.wait_p99_ms,
            );
        }
        s.push('\n');
    }
    s
}

/// One panel of a chart: lines against a logarithmic x.
struct Panel {
    title: String,
    x_desc: &'static str,
    y_desc: &'static str,
    log_y: bool,
    series: Vec<(&'static str, Vec<(f64, f64)>)>,
}

const COLORS: [plotters::style::RGBColor; 4] = [
    plotters::style::RGBColor(31, 119, 180),
    plotters::style::RGBColor(214, 39, 40),
    plotters::style::RGBColor(44, 160, 44),
    plotters::style::RGBColor(148, 103, 189),
];

/// An axis label: no decimals where they say nothing.
fn label(y: f64) -> String {
    let s = format!("{y:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn chart(path: &Path, panels: &[Panel]) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;

    let root = SVGBackend::new(path, (600 * panels.len() as u32, 380)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((1, panels.len()));
    for (panel, area) in panels.iter().zip(&areas) {
        let xs = panel.series.iter().flat_map(|(_, p)| p.iter().map(|p| p.0));
        let (xmin, xmax) = xs.fold((f64::MAX, 1.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
        let ys: Vec<f64> = panel
            .series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|p| p.1))
            .filter(|y| !panel.log_y || *y > 0.0)
            .collect();
        let ymax = ys.iter().copied().fold(1e-9, f64::max) * 1.5;
        let ymin = ys.iter().copied().fold(f64::MAX, f64::min).min(ymax);
        let x_range = (xmin.min(xmax) * 0.8)..(xmax * 1.25);
        let mut b = ChartBuilder::on(area);
        b.caption(&panel.title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64);
        macro_rules! draw {
            ($c:expr) => {{
                let mut c = $c;
                c.configure_mesh()
                    .x_desc(panel.x_desc)
                    .y_desc(panel.y_desc)
                    .x_label_formatter(&|x| format!("{x:.0}"))
                    .y_label_formatter(&|y| label(*y))
                    .draw()?;
                for (i, (label, pts)) in panel.series.iter().enumerate() {
                    let col = COLORS[i % COLORS.len()];
                    let pts: Vec<(f64, f64)> = pts
                        .iter()
                        .copied()
                        .filter(|p| !panel.log_y || p.1 > 0.0)
                        .collect();
                    c.draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))?
                        .label(*label)
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col));
                    c.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, col.filled())))?;
                }
                c.configure_series_labels()
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .position(SeriesLabelPosition::UpperLeft)
                    .draw()?;
            }};
        }
        if panel.log_y {
            draw!(b.build_cartesian_2d(
                x_range.log_scale(),
                ((ymin / 2.0).max(1e-6)..ymax * 2.0).log_scale()
            )?);
        } else {
            draw!(b.build_cartesian_2d(x_range.log_scale(), 0.0..ymax)?);
        }
    }
    root.present()?;
    Ok(())
}

/// Writes `scale.md` and one SVG per curve that ran into `dir`; returns the
/// Markdown.
pub fn write(c: &Curves, dir: &Path, heading: &str) -> Result<String, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let md = format!("{heading}\n\n{}", markdown(c));
    std::fs::write(dir.join("scale.md"), &md).map_err(|e| format!("scale.md: {e}"))?;
    let mut charts: Vec<(&str, Vec<Panel>)> = Vec::new();
    let mb = 1024.0 * 1024.0;
    if !c.keys.is_empty() {
        let k = &c.keys;
        charts.push((
            "scale-keys.svg",
            vec![
                Panel {
                    title: "distinct keys: sections / s".into(),
                    x_desc: "N distinct keys",
                    y_desc: "sections/s",
                    log_y: false,
                    series: vec![(
                        "lock + release",
                        k.iter().map(|r| (r.n as f64, r.throughput)).collect(),
                    )],
                },
                Panel {
                    title: "distinct keys: memory (MiB)".into(),
                    x_desc: "N distinct keys",
                    y_desc: "MiB",
                    log_y: false,
                    series: vec![
                        (
                            "RSS growth, pass 1",
                            k.iter()
                                .map(|r| {
                                    (
                                        r.n as f64,
                                        r.rss_after.saturating_sub(r.rss_before) as f64 / mb,
                                    )
                                })
                                .collect(),
                        ),
                        (
                            "RSS growth, pass 2",
                            k.iter()
                                .map(|r| {
                                    (
                                        r.n as f64,
                                        r.rss_after_second.saturating_sub(r.rss_after) as f64 / mb,
                                    )
                                })
                                .collect(),
                        ),
                        (
                            "Redis, right after",
                            k.iter()
                                .map(|r| {
                                    (
                                        r.n as f64,
                                        r.redis_after.saturating_sub(r.redis_before) as f64 / mb,
                                    )
                                })
                                .collect(),
                        ),
                        (
                            "Redis, settled",
                            k.iter()
                                .map(|r| {
                                    (
                                        r.n as f64,
                                        r.redis_settled.saturating_sub(r.redis_before) as f64 / mb,
                                    )
                                })
                                .collect(),
                        ),
                    ],
                },
            ],
        ));
    }
    if !c.waiters.is_empty() {
        let w = &c.waiters;
        charts.push((
            "scale-waiters.svg",
            vec![
                Panel {
                    title: "local waiters: µs per section, µs per cancel".into(),
                    x_desc: "T waiting tasks",
                    y_desc: "µs",
                    log_y: true,
                    series: vec![
                        (
                            "section after the release",
                            w.iter().map(|r| (r.t as f64, r.us_per_section)).collect(),
                        ),
                        (
                            "cancel, per waiter",
                            w.iter()
                                .map(|r| (r.t as f64, r.cancel_ms * 1e3 / r.t as f64))
                                .collect(),
                        ),
                    ],
                },
                Panel {
                    title: "local waiters: RSS per parked waiter (bytes)".into(),
                    x_desc: "T waiting tasks",
                    y_desc: "bytes",
                    log_y: false,
                    series: vec![(
                        "RSS / waiter",
                        w.iter().map(|r| (r.t as f64, r.bytes_per_waiter)).collect(),
                    )],
                },
            ],
        ));
    }
    if !c.held.is_empty() {
        let h = &c.held;
        charts.push((
            "scale-held.svg",
            vec![
                Panel {
                    title: "held leases: per renewal period".into(),
                    x_desc: "N held leases",
                    y_desc: "per period",
                    log_y: true,
                    series: vec![
                        (
                            "EVALSHA calls",
                            h.iter()
                                .map(|r| (r.n as f64, r.evalsha_per_period))
                                .collect(),
                        ),
                        (
                            "renewal requests (stats)",
                            h.iter()
                                .map(|r| (r.n as f64, r.renewals_per_period))
                                .collect(),
                        ),
                        (
                            "Redis CPU ms",
                            h.iter()
                                .map(|r| (r.n as f64, r.redis_cpu_ms_per_period))
                                .collect(),
                        ),
                        (
                            "client CPU ms",
                            h.iter()
                                .map(|r| (r.n as f64, r.client_cpu_ms_per_period))
                                .collect(),
                        ),
                    ],
                },
                Panel {
                    title: "held leases: bytes per lease".into(),
                    x_desc: "N held leases",
                    y_desc: "bytes",
                    log_y: false,
                    series: vec![
                        (
                            "RSS",
                            h.iter().map(|r| (r.n as f64, r.rss_per_lease)).collect(),
                        ),
                        (
                            "Redis used_memory",
                            h.iter().map(|r| (r.n as f64, r.redis_per_lease)).collect(),
                        ),
                    ],
                },
            ],
        ));
    }
    if !c.instances.is_empty() {
        let i = &c.instances;
        charts.push((
            "scale-instances.svg",
            vec![
                Panel {
                    title: "instances: per Redis release".into(),
                    x_desc: "P instances",
                    y_desc: "calls / release",
                    log_y: false,
                    series: vec![
                        (
                            "Redis commands",
                            i.iter()
                                .map(|r| (r.p as f64, r.commands_per_release))
                                .collect(),
                        ),
                        (
                            "PUBLISH",
                            i.iter()
                                .map(|r| (r.p as f64, r.publish_per_release))
                                .collect(),
                        ),
                    ],
                },
                Panel {
                    title: "instances: sections / s".into(),
                    x_desc: "P instances",
                    y_desc: "sections/s",
                    log_y: false,
                    series: vec![(
                        "one hot key",
                        i.iter().map(|r| (r.p as f64, r.throughput)).collect(),
                    )],
                },
                Panel {
                    title: "instances: a task's wait, p99".into(),
                    x_desc: "P instances",
                    y_desc: "ms",
                    log_y: false,
                    series: vec![(
                        "wait p99",
                        i.iter().map(|r| (r.p as f64, r.wait_p99_ms)).collect(),
                    )],
                },
            ],
        ));
    }
    for (name, panels) in &charts {
        chart(&dir.join(name), panels).map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::label;

    #[test]
    fn labels_drop_empty_decimals() {
        assert_eq!(label(2000.0), "2000");
        assert_eq!(label(10.0), "10");
        assert_eq!(label(0.0), "0");
        assert_eq!(label(0.25), "0.25");
    }
}
