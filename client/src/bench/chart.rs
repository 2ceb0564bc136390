//! The report's charts as standalone SVG files: the TTFT distribution by cache outcome (a CDF on
//! a log axis, since hits and misses are orders of magnitude apart) and a stacked bar of the
//! gateway's phases per outcome (where a miss's time goes, against a hit's).
//!
//! Drawn with plotters' SVG backend and no font feature: text is written as `<text>` elements in a
//! generic `sans-serif` family and laid out by estimate, so no font file is read or embedded.

use std::collections::BTreeMap;

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

use super::timing::{PhaseMeans, SEGMENTS};
use super::{fmt_ms, Sample};

const WIDTH: u32 = 860;

/// Colours by outcome name, stable across charts.
fn outcome_color(outcome: &str) -> RGBColor {
    match outcome {
        "miss" => RGBColor(214, 69, 65),
        "hit" => RGBColor(46, 139, 87),
        "semantic-hit" => RGBColor(52, 101, 164),
        "coalesced" => RGBColor(230, 145, 56),
        "none" => RGBColor(90, 90, 90),
        "refresh" => RGBColor(142, 68, 173),
        _ => RGBColor(160, 120, 60),
    }
}

const SEGMENT_COLORS: [RGBColor; 5] = [
    RGBColor(142, 68, 173),
    RGBColor(127, 140, 141),
    RGBColor(214, 69, 65),
    RGBColor(52, 101, 164),
    RGBColor(230, 145, 56),
];

/// The cumulative distribution of one outcome's TTFT.
#[derive(Debug, Clone, PartialEq)]
pub struct Cdf {
    /// Requests it describes.
    pub count: usize,
    /// `(ttft_ms, share at or below)`, possibly thinned.
    pub points: Vec<(f64, f64)>,
}

/// The TTFT distribution per outcome of one target's successful requests, thinned to at most
/// `max_points` per outcome (always keeping the last point).
pub fn cdf_series(samples: &[Sample], target: usize, max_points: usize) -> BTreeMap<String, Cdf> {
    let mut by_outcome: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for s in samples
        .iter()
        .filter(|s| s.target == target && s.error.is_none())
    {
        if let Some(t) = s.ttft_ms {
            by_outcome.entry(s.outcome.clone()).or_default().push(t);
        }
    }
    by_outcome
        .into_iter()
        .map(|(outcome, mut values)| {
            values.sort_by(f64::total_cmp);
            let n = values.len();
            let step = n.div_ceil(max_points.max(1)).max(1);
            let points = values
                .iter()
                .enumerate()
                .filter(|(i, _)| (i + 1) % step == 0 || i + 1 == n)
                .map(|(i, v)| (*v, (i + 1) as f64 / n as f64))
                .collect();
            (outcome, Cdf { count: n, points })
        })
        .collect()
}

/// An axis label without trailing zeros (0.1, 1, 10, 250).
fn axis_number(v: f64) -> String {
    let text = format!("{v:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn err(e: impl std::fmt::Display) -> String {
    format!("cannot draw the chart: {e}")
}

/// The TTFT CDF by outcome, as an SVG document; `None` when there is nothing to draw.
pub fn ttft_cdf(title: &str, series: &BTreeMap<String, Cdf>) -> Result<Option<String>, String> {
    let values = series.values().flat_map(|c| &c.points).map(|(v, _)| *v);
    let positive: Vec<f64> = values.filter(|v| *v > 0.0 && v.is_finite()).collect();
    let (Some(min), Some(max)) = (
        positive.iter().copied().reduce(f64::min),
        positive.iter().copied().reduce(f64::max),
    ) else {
        return Ok(None);
    };
    // Whole decades around the data, so the log axis labels read as 0.1, 1, 10, ...
    let lo = 10f64.powf(min.log10().floor()).max(1e-3);
    let hi = 10f64.powf(max.log10().ceil()).max(lo * 10.0);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(56)
            .build_cartesian_2d((lo..hi).log_scale(), 0f64..1f64)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("time to first token, ms (log scale)")
            .y_desc("share of requests at or below")
            .x_label_formatter(&|v| axis_number(*v))
            .y_label_formatter(&|v| format!("{:.0}%", v * 100.0))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(err)?;
        for (outcome, Cdf { count, points }) in series {
            let color = outcome_color(outcome);
            // A step function: the share jumps at each sample.
            let mut steps = Vec::with_capacity(points.len() * 2);
            let mut previous = 0.0;
            for (v, share) in points {
                let v = v.max(lo);
                steps.push((v, previous));
                steps.push((v, *share));
                previous = *share;
            }
            chart
                .draw_series(LineSeries::new(steps, color.stroke_width(2)))
                .map_err(err)?
                .label(format!("{outcome} (n={count})"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(RGBColor(180, 180, 180))
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(Some(svg))
}

/// Segment values (ms) of each outcome's mean phases, in `SEGMENTS` order.
pub fn phase_bars(phases: &BTreeMap<String, PhaseMeans>) -> Vec<(String, Vec<f64>)> {
    // Misses first, then the cache answers, then anything else.
    let rank = |o: &str| match o {
        "miss" => 0,
        "hit" => 1,
        "semantic-hit" => 2,
        "coalesced" => 3,
        _ => 4,
    };
    let mut bars: Vec<(String, Vec<f64>)> = phases
        .iter()
        .map(|(o, m)| {
            let values = m.segments.iter().map(|v| v.max(0.0)).collect();
            (format!("{o} (n={})", m.timed), values)
        })
        .collect();
    bars.sort_by_key(|(o, _)| rank(o.split(' ').next().unwrap_or("")));
    bars
}

/// The stacked phase bars, in milliseconds (top) and as shares of each bar (bottom), misses on top.
pub fn phase_stack(title: &str, bars: &[(String, Vec<f64>)]) -> Result<Option<String>, String> {
    if bars.is_empty() {
        return Ok(None);
    }
    let n = bars.len();
    // Segment i of the y axis holds bar n-1-i, so the first bar is drawn on top.
    let row = |bar: usize| n - 1 - bar;
    let panel = 60 + 44 * n as u32;
    let legend_rows = SEGMENTS.len().div_ceil(3) as u32;
    let legend_height = 10 + 22 * legend_rows;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 2 * panel + legend_height + 40))
            .into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root.titled(title, ("sans-serif", 20)).map_err(err)?;
        // The legend gets its own strip, so it never covers a bar.
        let (legend, charts) = root.split_vertically(legend_height);
        for (s, (label, _)) in SEGMENTS.iter().enumerate() {
            let (x, y) = (20 + 280 * (s % 3) as i32, 6 + 22 * (s / 3) as i32);
            let color = SEGMENT_COLORS[s % SEGMENT_COLORS.len()];
            legend
                .draw(&Rectangle::new(
                    [(x, y + 2), (x + 12, y + 14)],
                    color.filled(),
                ))
                .map_err(err)?;
            legend
                .draw(&Text::new(
                    *label,
                    (x + 18, y + 1),
                    ("sans-serif", 13).into_font(),
                ))
                .map_err(err)?;
        }
        let (top, bottom) = charts.split_vertically(panel);
        let longest = bars
            .iter()
            .map(|(_, v)| v.iter().sum::<f64>())
            .fold(0.0, f64::max)
            .max(1e-3);
        for (area, share) in [(&top, false), (&bottom, true)] {
            let x_max = if share { 100.0 } else { longest * 1.15 };
            let mut chart = ChartBuilder::on(area)
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(150)
                // An integer range includes its end: 0..n-1 makes n segments. One segment
                // alone gets no label from plotters, so a single bar shares the axis with a gap.
                .build_cartesian_2d(0f64..x_max, (0..(n - 1).max(1)).into_segmented())
                .map_err(err)?;
            chart
                .configure_mesh()
                .disable_y_mesh()
                .x_desc(if share {
                    "share of the request's time, %"
                } else {
                    "mean time, ms"
                })
                .x_label_formatter(&|v| axis_number(*v))
                .y_label_formatter(&|v| match v {
                    SegmentValue::CenterOf(i) if *i < n => bars[row(*i)].0.clone(),
                    _ => String::new(),
                })
                .light_line_style(RGBColor(235, 235, 235))
                .draw()
                .map_err(err)?;
            for s in 0..SEGMENTS.len() {
                let color = SEGMENT_COLORS[s % SEGMENT_COLORS.len()];
                let rects = bars.iter().enumerate().map(|(b, (_, values))| {
                    let total: f64 = values.iter().sum();
                    let scale = match (share, total > 0.0) {
                        (false, _) => 1.0,
                        (true, true) => 100.0 / total,
                        (true, false) => 0.0,
                    };
                    let x0: f64 = values[..s].iter().sum::<f64>() * scale;
                    let x1 = x0 + values[s] * scale;
                    let mut r = Rectangle::new(
                        [
                            (x0, SegmentValue::Exact(row(b))),
                            (x1, SegmentValue::Exact(row(b) + 1)),
                        ],
                        color.filled(),
                    );
                    r.set_margin(6, 6, 0, 0);
                    r
                });
                chart.draw_series(rects).map_err(err)?;
            }
            if !share {
                // The total at the end of each bar: a hit's bar is too short to see at this scale.
                let totals = bars.iter().enumerate().map(|(b, (_, values))| {
                    let total: f64 = values.iter().sum();
                    Text::new(
                        format!(" {} ms", fmt_ms(total)),
                        (total, SegmentValue::CenterOf(row(b))),
                        ("sans-serif", 13).into_font(),
                    )
                });
                chart.draw_series(totals).map_err(err)?;
            }
        }
        root.present().map_err(err)?;
    }
    Ok(Some(svg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::timing::Phases;

    fn parse(svg: &str) -> roxmltree::Document<'_> {
        roxmltree::Document::parse(svg).expect("well-formed SVG")
    }

    fn texts(doc: &roxmltree::Document<'_>) -> Vec<String> {
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text().map(|t| t.trim().to_owned()))
            .collect()
    }

    fn standalone(doc: &roxmltree::Document<'_>) {
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert_eq!(
            root.tag_name().namespace(),
            Some("http://www.w3.org/2000/svg")
        );
        // Nothing is loaded from elsewhere: no images, links or font faces.
        assert!(!doc.descendants().any(|n| n.has_tag_name("image")
            || n.has_tag_name("font-face")
            || n.attributes().any(|a| a.name() == "href")));
    }

    #[test]
    fn cdf_points_are_cumulative_and_thinned() {
        let mut samples = Vec::new();
        for i in 0..1000 {
            let mut s = crate::bench::tests::sample(0, i, 1.0 + i as f64, "miss");
            if i % 2 == 0 {
                s.outcome = "hit".into();
            }
            samples.push(s);
        }
        samples.push(crate::bench::tests::sample(1, 0, 5.0, "none"));
        let series = cdf_series(&samples, 0, 100);
        assert_eq!(series.len(), 2);
        assert_eq!(series["miss"].count, 500);
        let miss = &series["miss"].points;
        assert!(miss.len() <= 100);
        assert_eq!(miss.last().map(|p| p.1), Some(1.0));
        assert!(miss.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
    }

    #[test]
    fn the_cdf_is_a_standalone_svg_with_labels() {
        let mut series = BTreeMap::new();
        let cdf = |points: Vec<(f64, f64)>| Cdf {
            count: points.len(),
            points,
        };
        series.insert("miss".to_owned(), cdf(vec![(400.0, 0.5), (450.0, 1.0)]));
        series.insert("semantic-hit".to_owned(), cdf(vec![(7.0, 0.5), (9.5, 1.0)]));
        series.insert("hit".to_owned(), cdf(vec![(0.3, 1.0)]));
        let svg = ttft_cdf("TTFT <by> outcome & more", &series)
            .expect("draws")
            .expect("something to draw");
        let doc = parse(&svg);
        standalone(&doc);
        let texts = texts(&doc);
        assert!(
            texts.iter().any(|t| t == "TTFT <by> outcome & more"),
            "{texts:?}"
        );
        assert!(texts.iter().any(|t| t == "semantic-hit (n=2)"), "{texts:?}");
        assert!(
            doc.descendants()
                .filter(|n| n.has_tag_name("polyline"))
                .count()
                >= 3
        );
        assert_eq!(ttft_cdf("empty", &BTreeMap::new()).expect("ok"), None);
    }

    #[test]
    fn the_phase_stack_is_a_standalone_svg_with_every_segment() {
        let mean = |ttft: f64, send: Option<f64>| {
            PhaseMeans::of([&Phases {
                ingress_ms: Some(0.1),
                lookup_ms: Some(0.05),
                upstream_send_ms: send,
                ttft_ms: Some(ttft),
                decode_ms: Some(ttft / 2.0),
                downstream_ms: Some(0.2),
                ..Phases::default()
            }])
            .map(|mut m| {
                m.timed = 3;
                m
            })
            .expect("means")
        };
        let mut phases = BTreeMap::new();
        phases.insert("hit".to_owned(), mean(0.4, None));
        phases.insert("miss".to_owned(), mean(400.0, Some(0.3)));
        let bars = phase_bars(&phases);
        assert!(bars[0].0.starts_with("miss"));
        assert!((bars[0].1.iter().sum::<f64>() - 600.65).abs() < 1e-9);
        let svg = phase_stack("phases", &bars).expect("draws").expect("bars");
        let doc = parse(&svg);
        standalone(&doc);
        let labels = texts(&doc);
        for (label, _) in SEGMENTS {
            assert!(labels.iter().any(|t| t == label), "{label} in {labels:?}");
        }
        assert!(
            labels.iter().any(|t| t.contains("miss (n=3)")),
            "{labels:?}"
        );
        assert!(
            labels
                .iter()
                .any(|t| t.trim() == "600.6 ms" || t.trim() == "600.7 ms"),
            "{labels:?}"
        );
        assert!(
            doc.descendants().filter(|n| n.has_tag_name("rect")).count() >= 2 * 2 * SEGMENTS.len()
        );
        assert_eq!(phase_stack("none", &[]).expect("ok"), None);
        let one = phase_stack("one", &bars[..1])
            .expect("draws")
            .expect("a bar");
        assert!(texts(&parse(&one))
            .iter()
            .any(|t| t.starts_with("miss (n=3)")));
    }
}
