//! Reading the gateway's own phase timing from a response: the `: reprise-timing {json}` comment a
//! stream carries before `data: [DONE]`, or the `Server-Timing` header of a non-streamed answer.
//!
//! Both are parsed by the wire contract's [`Phases`] (`reprise-wire`), which reads any gateway
//! version that sends them and ignores what it does not know; this file adds what the bench makes
//! of them: the gateway's share, the stacked-bar segments and the means.

pub use reprise_wire::Phases;
use serde::Serialize;

/// The gateway's own work before anything goes upstream: ingress, lookup, embed and search.
pub fn gateway_ms(p: &Phases) -> f64 {
    [p.ingress_ms, p.lookup_ms, p.embed_ms, p.search_ms]
        .iter()
        .flatten()
        .sum()
}

/// A segment of the per-phase stacked bar: its label, and its value in a set of phases.
pub type Segment = (&'static str, fn(&Phases) -> f64);

/// The segments of the per-phase stacked bar, in drawing order.
pub const SEGMENTS: &[Segment] = &[
    ("gateway (ingress, lookup, embed, search)", gateway_ms),
    ("upstream send", |p| p.upstream_send_ms.unwrap_or(0.0)),
    ("ttft (prefill, or replay start on a hit)", replay_or_ttft),
    ("decode", |p| p.decode_ms.unwrap_or(0.0)),
    ("downstream", |p| p.downstream_ms.unwrap_or(0.0)),
];

/// The time to first token past the gateway's own work. A request that went upstream measures it
/// from the send; one that did not (a hit, a coalesced follower) from the parsed request, so its
/// lookup, embedding and search are taken out to count them once.
fn replay_or_ttft(p: &Phases) -> f64 {
    let ttft = p.ttft_ms.unwrap_or(0.0);
    match p.upstream_send_ms {
        Some(_) => ttft,
        None => (ttft - gateway_ms(p) + p.ingress_ms.unwrap_or(0.0)).max(0.0),
    }
}

/// Mean of every phase over a set of requests; a phase a request did not have counts as 0 (an
/// exact hit spends nothing upstream), so the means add up like the requests' phases do.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PhaseMeans {
    /// Requests that carried a timing.
    pub timed: usize,
    pub mean: Phases,
    /// Mean of each `SEGMENTS` value, taken request by request (a segment can depend on which
    /// phases a request had, which means no longer show).
    pub segments: Vec<f64>,
}

impl PhaseMeans {
    pub fn of<'a>(phases: impl IntoIterator<Item = &'a Phases>) -> Option<Self> {
        let mut sum = [0.0f64; 9];
        let mut segments = vec![0.0f64; SEGMENTS.len()];
        let mut n = 0usize;
        for p in phases {
            n += 1;
            for (s, v) in sum.iter_mut().zip(fields(p)) {
                *s += v.unwrap_or(0.0);
            }
            for (s, (_, f)) in segments.iter_mut().zip(SEGMENTS) {
                *s += f(p);
            }
        }
        if n == 0 {
            return None;
        }
        let m = sum.map(|s| Some(s / n as f64));
        Some(Self {
            timed: n,
            mean: Phases {
                ingress_ms: m[0],
                lookup_ms: m[1],
                embed_ms: m[2],
                search_ms: m[3],
                upstream_send_ms: m[4],
                ttft_ms: m[5],
                decode_ms: m[6],
                downstream_ms: m[7],
                total_ms: m[8].unwrap_or(0.0),
                ..Phases::default()
            },
            segments: segments.into_iter().map(|s| s / n as f64).collect(),
        })
    }
}

impl PhaseMeans {
    /// The nine means as report cells, in phase order (ingress … total).
    pub fn mean_cells(&self) -> [String; 9] {
        fields(&self.mean).map(|v| crate::bench::fmt_ms(v.unwrap_or(0.0)))
    }
}

fn fields(p: &Phases) -> [Option<f64>; 9] {
    [
        p.ingress_ms,
        p.lookup_ms,
        p.embed_ms,
        p.search_ms,
        p.upstream_send_ms,
        p.ttft_ms,
        p.decode_ms,
        p.downstream_ms,
        Some(p.total_ms),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_stream_comment() {
        let line = b": reprise-timing {\"ingress_ms\":0.1,\"lookup_ms\":0.2,\"ttft_ms\":50.5,\"total_ms\":60.0,\"tokens\":3,\"itl_p50_ms\":null}\n";
        let p = Phases::from_sse_line(line).expect("timing");
        assert_eq!(p.ingress_ms, Some(0.1));
        assert_eq!(p.ttft_ms, Some(50.5));
        assert_eq!(p.decode_ms, None);
        assert_eq!(p.total_ms, 60.0);
        assert!((gateway_ms(&p) - 0.3).abs() < 1e-9);
        assert_eq!(Phases::from_sse_line(b"data: {}"), None);
        assert_eq!(Phases::from_sse_line(b": reprise-timing not json"), None);
    }

    #[test]
    fn reads_server_timing() {
        let p = Phases::from_server_timing(
            "ingress;dur=0.050, embed;dur=9.5, ttft;desc=\"x\";dur=401.25, cache, other;dur=3, total;dur=950",
        )
        .expect("timing");
        assert_eq!(p.ingress_ms, Some(0.05));
        assert_eq!(p.embed_ms, Some(9.5));
        assert_eq!(p.ttft_ms, Some(401.25));
        assert_eq!(p.total_ms, 950.0);
        assert_eq!(p.lookup_ms, None);
        assert_eq!(Phases::from_server_timing("cache;desc=hit"), None);
    }

    #[test]
    fn means_count_missing_phases_as_zero() {
        let a = Phases {
            upstream_send_ms: Some(2.0),
            ttft_ms: Some(100.0),
            total_ms: 110.0,
            ..Phases::default()
        };
        let b = Phases {
            ttft_ms: Some(0.5),
            total_ms: 1.0,
            ..Phases::default()
        };
        let m = PhaseMeans::of([&a, &b]).expect("means");
        assert_eq!(m.timed, 2);
        assert_eq!(m.mean.upstream_send_ms, Some(1.0));
        assert_eq!(m.mean.ttft_ms, Some(50.25));
        assert_eq!(m.mean.ingress_ms, Some(0.0));
        assert_eq!(PhaseMeans::of([]), None);
    }

    #[test]
    fn a_hit_counts_its_lookup_once() {
        let hit = Phases {
            ingress_ms: Some(0.1),
            lookup_ms: Some(0.2),
            embed_ms: Some(8.0),
            search_ms: Some(0.5),
            ttft_ms: Some(9.0),
            total_ms: 9.2,
            ..Phases::default()
        };
        let m = PhaseMeans::of([&hit]).expect("means");
        // gateway 8.8, then the replay's own 0.3 ms: 9.1 = ingress + the gateway's ttft.
        assert!((m.segments[0] - 8.8).abs() < 1e-9);
        assert!((m.segments[2] - 0.3).abs() < 1e-9);
        let miss = Phases {
            upstream_send_ms: Some(0.1),
            ..hit
        };
        assert_eq!(PhaseMeans::of([&miss]).expect("means").segments[2], 9.0);
    }
}
