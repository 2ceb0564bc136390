//! A growing graph segment: the `hnsw_rs` graph a partition's inserts go to until it is sealed,
//! with a sign sketch per point, by which a search reads it.
//!
//! Why: a growing segment holds up to `seal_points` points (65,536 by default), the newest of its
//! partition and so the ones a cache is most likely to be asked again soon. `hnsw_rs`'s search of
//! so large a graph is slow (2.4-2.7 ms p50 at ef 128 for 60,000 points, five times a sealed
//! graph's of 200,000) and misses a near duplicate now and then, as any greedy search does. A scan
//! of its points' sketches finds the near duplicates a cache serves for a few hundredths of that,
//! as it does in a large flat partition; the graph is still built, for the segment's sealing.
//! A sealed segment keeps its rows' sketches beside its arrays. Here `hnsw_rs` holds the rows,
//! each in an allocation of its own that only its [`PointId`] finds, so each point's sketch is kept
//! with its slot and that id, and the few candidates a scan picks are read back through `hnsw_rs`
//! to be scored exactly.
//!
//! `hnsw_rs`'s insert does not say which [`PointId`] it gave the point: it puts it at the end of
//! the layer it drew for it. Inserts into one segment run one at a time (the index's `writer`
//! lock), so the one layer whose count grew during an insert names it.

use std::sync::{Arc, PoisonError, RwLock};

use half::f16;
use hnsw_rs::hnsw::{Hnsw, PointId};
use hnsw_rs::prelude::Distance;

use super::quant::dot_f32_f16;
use super::sealed::each_point;
use super::sketch::{nearest, Planes, Sketch, CANDIDATES};

pub(super) struct Growing<D: Distance<f16>> {
    graph: Hnsw<'static, f16, D>,
    planes: Arc<Planes>,
    rows: RwLock<Rows>,
}

/// Row `i` is a point of the graph: its sketch, its slot (`hnsw_rs`'s data id) and where
/// `hnsw_rs` holds it. Rows follow the order the points were sketched in, not the graph's.
#[derive(Default)]
struct Rows {
    sketches: Vec<Sketch>,
    slots: Vec<u32>,
    points: Vec<PointId>,
}

impl Rows {
    fn push(&mut self, sketch: Sketch, slot: usize, point: PointId) {
        // Slots are u32 throughout the index; a point past them is searched by the graph only.
        let Ok(slot) = u32::try_from(slot) else {
            return;
        };
        self.sketches.push(sketch);
        self.slots.push(slot);
        self.points.push(point);
    }
}

impl<D: Distance<f16> + Send + Sync> Growing<D> {
    /// `graph` with a sketch of every point it holds already (a graph loaded from a dump, or one
    /// built that could not be sealed).
    pub(super) fn new(graph: Hnsw<'static, f16, D>, dim: usize) -> Self {
        let planes = Planes::of(dim);
        let mut rows = Rows::default();
        each_point(&graph, |point| {
            rows.push(
                planes.sketch_row(point.get_v()),
                point.get_origin_id(),
                point.get_point_id(),
            );
        });
        Self {
            graph,
            planes,
            rows: RwLock::new(rows),
        }
    }

    pub(super) fn graph(&self) -> &Hnsw<'static, f16, D> {
        &self.graph
    }

    /// Points in the graph.
    pub(super) fn len(&self) -> usize {
        self.graph.get_nb_point()
    }

    /// Inserts `code` as point `slot` and keeps its sketch. The caller keeps other inserts into
    /// this segment out meanwhile (see the module comment): were one to run beside it, the point
    /// would be in the graph (found by a search through it, and sealed with the segment) but not
    /// by a search of the sketches.
    pub(super) fn insert(&self, code: &[f16], slot: usize) {
        let sketch = self.planes.sketch_row(code);
        let before = self.layer_counts();
        self.graph.insert_slice((code, slot));
        let after = self.layer_counts();
        let mut grown = before
            .iter()
            .zip(&after)
            .enumerate()
            .filter(|(_, (before, after))| after > before)
            .map(|(layer, (before, _))| (layer, *before));
        let (Some((layer, rank)), None) = (grown.next(), grown.next()) else {
            debug_assert!(false, "an insert into a growing segment ran beside another");
            return;
        };
        let (Ok(layer), Ok(rank)) = (u8::try_from(layer), i32::try_from(rank)) else {
            return;
        };
        self.rows
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(sketch, slot, PointId(layer, rank));
    }

    /// Points in each layer `hnsw_rs` may put one in.
    fn layer_counts(&self) -> Vec<usize> {
        let indexation = self.graph.get_point_indexation();
        (0..self.graph.get_max_level())
            .map(|layer| indexation.get_layer_nb_point(layer))
            .collect()
    }

    /// The near duplicates of `query` (L2-normalized; `sketch` its sketch) among the points for
    /// whose slot `live` holds, as `(slot, similarity)`, most similar first: the [`CANDIDATES`]
    /// whose sketches differ least from the query's, scored exactly with their f16 rows.
    pub(super) fn near_duplicates(
        &self,
        query: &[f32],
        sketch: Sketch,
        live: impl Fn(usize) -> bool,
    ) -> Vec<(usize, f32)> {
        let rows = self.rows.read().unwrap_or_else(PoisonError::into_inner);
        // A segment of at most 65,536 rows: liveness is asked of every row that would enter the
        // kept set, a few hundred lookups, rather than in a second pass as a sealed segment does.
        let live_row = |row: u32| {
            rows.slots
                .get(row as usize)
                .is_some_and(|slot| live(*slot as usize))
        };
        let indexation = self.graph.get_point_indexation();
        let mut found: Vec<(usize, f32)> = nearest(&rows.sketches, 0, sketch, CANDIDATES, live_row)
            .into_iter()
            .filter_map(|(_, row)| {
                let row = row as usize;
                let code = indexation.get_point_data(rows.points.get(row)?)?;
                Some((*rows.slots.get(row)? as usize, dot_f32_f16(query, &code)))
            })
            .collect();
        found.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::quant::{encode_f16, DistF16};
    use crate::index::tests::unit;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn near(rng: &mut StdRng, v: &[f32]) -> Vec<f32> {
        let noise = unit(rng, v.len());
        let q: Vec<f32> = v.iter().zip(&noise).map(|(v, n)| v + 0.25 * n).collect();
        let norm = q.iter().map(|x| x * x).sum::<f32>().sqrt();
        q.into_iter().map(|x| x / norm).collect()
    }

    fn graph(points: usize) -> Hnsw<'static, f16, DistF16> {
        let mut graph = Hnsw::new(4, points, 16, 8, DistF16);
        graph.set_extend_candidates(false);
        graph
    }

    /// Every point inserted one at a time (on levels `hnsw_rs` draws, so on several layers) is
    /// found by its sketch and scored with its own row: the place read from the layer counts is
    /// the point's. A segment made from a filled graph (as a dump loads one) agrees, and a point
    /// whose slot is not live never comes back.
    #[test]
    fn each_point_is_found_by_its_sketch_and_scored_with_its_own_row() {
        let dim = 32;
        let mut rng = StdRng::seed_from_u64(41);
        let vectors: Vec<Vec<f32>> = (0..2_000).map(|_| unit(&mut rng, dim)).collect();
        let segment = Growing::new(graph(vectors.len()), dim);
        for (i, v) in vectors.iter().enumerate() {
            segment.insert(&encode_f16(v), i + 7);
        }
        assert_eq!(segment.len(), vectors.len());
        let layers = {
            let rows = segment.rows.read().expect("rows");
            assert_eq!(rows.slots.len(), vectors.len(), "a row per point");
            rows.points.iter().map(|p| p.0).max()
        };
        assert!(layers > Some(0), "points on upper layers too");
        let loaded = Growing::new(
            {
                let graph = graph(vectors.len());
                for (i, v) in vectors.iter().enumerate() {
                    graph.insert_slice((&encode_f16(v), i + 7));
                }
                graph
            },
            dim,
        );
        for (i, v) in vectors.iter().enumerate().step_by(37) {
            let query = near(&mut rng, v);
            let sketch = segment.planes.sketch(&query);
            let exact = dot_f32_f16(&query, &encode_f16(v));
            for found in [
                segment.near_duplicates(&query, sketch, |_| true),
                loaded.near_duplicates(&query, sketch, |_| true),
            ] {
                assert_eq!(found.len(), CANDIDATES);
                assert_eq!(found[0], (i + 7, exact), "its own slot and row");
                assert!(found.windows(2).all(|w| w[0].1 >= w[1].1));
            }
            let gone = segment.near_duplicates(&query, sketch, |slot| slot != i + 7);
            assert_eq!(gone.len(), CANDIDATES);
            assert!(
                gone.iter().all(|(slot, _)| *slot != i + 7),
                "a removed point"
            );
        }
    }
}
