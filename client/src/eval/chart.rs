//! The threshold curve of an evaluation as SVG (plotters, SVG backend): x = similarity threshold,
//! y = share of pairs served, one line for should-hit pairs and one for traps (wrong answers), the
//! gateway's threshold and the best thresholds under the wrong-answer budgets marked.
//!
//! plotters is built without its font features: text goes into the SVG as `<text>` elements that
//! the viewer renders, so no system font is read at build or run time.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::score::{self, Best, Scored};

const WIDTH: u32 = 860;
const HEIGHT: u32 = 500;
const HIT_COLOR: RGBColor = RGBColor(31, 119, 180);
const TRAP_COLOR: RGBColor = RGBColor(214, 39, 40);
const GATEWAY_COLOR: RGBColor = RGBColor(90, 90, 90);
const BEST_COLOR: RGBColor = RGBColor(44, 160, 44);

/// The left end of the x axis: low enough to show where most pairs lie (the 5th percentile of the
/// similarities, rounded down to 0.1), never above 0.7 so the usual thresholds are all in view.
fn x_start(scored: &[Scored]) -> f64 {
    let sims = score::candidates(scored);
    let low = if sims.is_empty() {
        0.5
    } else {
        sims[(sims.len() - 1) / 20]
    };
    ((low * 10.0).floor() / 10.0).clamp(0.0, 0.7)
}

/// Renders the curve; the error names what plotters could not draw.
pub fn threshold_curve(
    scored: &[Scored],
    gateway_threshold: f64,
    best: &[(f64, Option<Best>)],
    title: &str,
) -> Result<String, String> {
    let low = x_start(scored).min(gateway_threshold);
    let points = score::sweep(scored, &score::curve_thresholds(scored, low));
    // Conversations that differ before their last turn are never compared: flat lines at zero
    // would read like a broken chart without a word on why.
    let note = (!scored.is_empty() && scored.iter().all(|s| s.similarity.is_none() && !s.exact))
        .then_some("no pair found a candidate: a and b are in different cache partitions");
    let mut svg = String::new();
    draw(&mut svg, low, &points, gateway_threshold, best, title, note)
        .map_err(|e| format!("drawing the threshold curve: {e}"))?;
    Ok(svg)
}

fn draw(
    svg: &mut String,
    low: f64,
    points: &[score::Point],
    gateway_threshold: f64,
    best: &[(f64, Option<Best>)],
    title: &str,
    note: Option<&str>,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::with_string(svg, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(18)
        .x_label_area_size(48)
        .y_label_area_size(60)
        .build_cartesian_2d(low..1.0f64, 0.0..100.0f64)?;
    chart
        .configure_mesh()
        .x_desc("similarity threshold")
        .y_desc("pairs served (%)")
        .x_labels(11)
        .y_labels(11)
        .x_label_formatter(&|x| format!("{x:.2}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;

    let line = |share: fn(&score::Point) -> Option<f64>| -> Vec<(f64, f64)> {
        points
            .iter()
            .filter_map(|p| share(p).map(|s| (p.threshold, s * 100.0)))
            .collect()
    };
    chart
        .draw_series(LineSeries::new(
            line(|p| p.hit_share),
            HIT_COLOR.stroke_width(2),
        ))?
        .label("should-hit pairs served")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], HIT_COLOR.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(
            line(|p| p.trap_share),
            TRAP_COLOR.stroke_width(2),
        ))?
        .label("traps served (wrong answers)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], TRAP_COLOR.stroke_width(2)));
    chart
        .draw_series(DashedLineSeries::new(
            vec![(gateway_threshold, 0.0), (gateway_threshold, 100.0)],
            6,
            4,
            GATEWAY_COLOR.stroke_width(1),
        ))?
        .label(format!("gateway threshold {gateway_threshold:.2}"))
        .legend(|(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], GATEWAY_COLOR.stroke_width(1))
        });
    // One marker per distinct best threshold, its label naming every budget it is best for,
    // placed on the side of the point with more room.
    let mut marks: Vec<(Best, Vec<f64>)> = Vec::new();
    for (budget, b) in best
        .iter()
        .filter_map(|(budget, b)| b.map(|b| (*budget, b)))
    {
        match marks.iter_mut().find(|(m, _)| m.threshold == b.threshold) {
            Some((_, budgets)) => budgets.push(budget),
            None => marks.push((b, vec![budget])),
        }
    }
    for (b, budgets) in marks.iter().filter(|(b, _)| b.threshold >= low) {
        let budgets: Vec<String> = budgets
            .iter()
            .map(|x| format!("≤{:.0}%", x * 100.0))
            .collect();
        let label = format!(
            "best at {} wrong: {:.4}",
            budgets.join(" and "),
            b.threshold
        );
        let right_half = b.threshold > (low + 1.0) / 2.0;
        let (dx, hpos) = if right_half {
            (-8, HPos::Right)
        } else {
            (8, HPos::Left)
        };
        let style = ("sans-serif", 13)
            .into_font()
            .color(&BEST_COLOR)
            .pos(Pos::new(hpos, VPos::Bottom));
        chart.draw_series(std::iter::once(
            EmptyElement::at((b.threshold, b.hit_share * 100.0))
                + Circle::new((0, 0), 4, BEST_COLOR.filled())
                + Text::new(label, (dx, -6), style),
        ))?;
    }
    if let Some(note) = note {
        let style = ("sans-serif", 15)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Center));
        chart.draw_series(std::iter::once(Text::new(
            note.to_owned(),
            ((low + 1.0) / 2.0, 50.0),
            style,
        )))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 13))
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scored() -> Vec<Scored> {
        let mut v = Vec::new();
        for i in 0..20 {
            v.push(Scored {
                same_answer: i % 2 == 0,
                exact: false,
                similarity: Some(0.6 + 0.02 * i as f64),
                guarded: false,
            });
        }
        v
    }

    #[test]
    fn the_curve_is_an_svg_with_both_lines_and_the_threshold() {
        let s = scored();
        let best = vec![(0.05, score::best_within(&s, 0.05))];
        let svg = threshold_curve(&s, 0.9, &best, "Questions").expect("renders");
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        for text in [
            "Questions",
            "should-hit pairs served",
            "traps served (wrong answers)",
            "gateway threshold 0.90",
            "similarity threshold",
        ] {
            assert!(svg.contains(text), "missing {text}");
        }
        // Both lines are drawn in their colours.
        assert!(
            svg.contains("#1F77B4") || svg.contains("rgb(31,119,180)"),
            "hit line"
        );
        assert!(
            svg.contains("#D62728") || svg.contains("rgb(214,39,40)"),
            "trap line"
        );
    }

    #[test]
    fn a_run_without_candidates_says_so_on_the_chart() {
        let none = vec![
            Scored {
                same_answer: true,
                exact: false,
                similarity: None,
                guarded: false,
            };
            4
        ];
        let svg = threshold_curve(&none, 0.9, &[], "Conversations").expect("renders");
        assert!(svg.contains("no pair found a candidate"));
        let svg = threshold_curve(&scored(), 0.9, &[], "Questions").expect("renders");
        assert!(!svg.contains("no pair found a candidate"));
    }

    #[test]
    fn x_axis_starts_below_most_similarities() {
        assert_eq!(x_start(&scored()), 0.6);
        assert_eq!(x_start(&[]), 0.5);
        let high = vec![
            Scored {
                same_answer: true,
                exact: false,
                similarity: Some(0.99),
                guarded: false,
            };
            3
        ];
        assert_eq!(x_start(&high), 0.7);
    }
}
