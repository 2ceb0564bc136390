//! Sign sketches (SimHash) of the rows of graph segments and flat partitions, and the scan that
//! finds a query's near duplicates by them: when a graph search found nothing near, and in a large
//! partition awaiting its graph.
//!
//! Why: a graph search is greedy, and on vectors without structure to follow (random ones, the
//! issue's worst case) it misses a query's nearest row half the time at a million rows, even when
//! that row is a near duplicate (cosine 0.96) standing far above every other (cosine under 0.3).
//! A cache only needs the near duplicates, and those are what a 128-bit sketch finds by a scan of
//! 16 bytes per row: a scan of a million rows reads 16 MB instead of the rows' 768 MB.
//!
//! Each bit is the side of a fixed random hyperplane (Gaussian normal) a vector falls on, so two
//! vectors at angle θ disagree on a bit with probability θ/π, whatever the data's distribution
//! (Charikar 2002): a near duplicate at cosine 0.96 differs in about 12 of 128 bits (σ ≈ 3), an
//! unrelated vector at cosine 0 in 64 (σ ≈ 6), a same-topic one at 0.5 in 43. The scan of each chunk
//! of rows keeps the [`CANDIDATES`] live rows with the fewest differing bits and scores them exactly, so a sketch only
//! picks which rows are read, never decides a similarity. The hyperplanes come from a fixed seed
//! through this module's own generator. Sketches are never saved: they are computed again from
//! the rows whenever a segment is sealed or loaded, so the planes, and the rounding of the sums
//! (fused or not), only need to agree within one process.

use std::sync::{Arc, LazyLock, Mutex};

use half::f16;
use std::collections::BinaryHeap;

use pulp::{Arch, Simd, WithSimd};
use rayon::prelude::*;

use super::quant::widen;

/// 128 hyperplanes, one bit each.
pub type Sketch = [u64; 2];

/// Bits in a sketch.
pub const BITS: usize = 128;

/// Rows a scan of one chunk of sketches keeps for exact scoring. Reading one costs about a cache
/// miss per 64 bytes of the row (0.3-0.5 µs at 384 dimensions); 64 per chunk of 2^18 rows (256
/// for a million) are a few per cent of the scan, and leave room, in a dense topic, for rows that
/// share many bits with the query without being near duplicates.
pub const CANDIDATES: usize = 64;

/// Seed of the hyperplanes: changing it changes every sketch (harmless, as none is saved).
const SEED: u64 = 0x5245_5052_4953_4531; // "REPRISE1"

/// The hyperplanes of one dimension, stored coordinate by coordinate: value `j` of every normal,
/// then value `j + 1`, so a sketch is a pass over the vector that updates many sums side by side
/// (SIMD-wide), not 128 dot products.
pub struct Planes {
    dim: usize,
    by_coordinate: Vec<f32>,
}

/// SplitMix64 (Steele, Lea and Flood 2014): a generator fixed here, so no crate update can change
/// the hyperplanes.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform value in (0, 1] from 53 random bits.
fn uniform(state: &mut u64) -> f64 {
    ((splitmix(state) >> 11) + 1) as f64 / (1u64 << 53) as f64
}

impl Planes {
    fn new(dim: usize) -> Self {
        let mut state = SEED;
        // Box-Muller: a vector of independent normals points in a uniform direction, which is
        // what makes a bit's disagreement θ/π.
        let by_coordinate = (0..BITS * dim)
            .map(|_| {
                let (u, v) = (uniform(&mut state), uniform(&mut state));
                ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
            })
            .collect();
        Self { dim, by_coordinate }
    }

    /// The planes for `dim`, made once per dimension in use (a gateway has one).
    pub fn of(dim: usize) -> Arc<Planes> {
        static PLANES: LazyLock<Mutex<Vec<Arc<Planes>>>> = LazyLock::new(Mutex::default);
        let mut made = crate::lock::lock(&PLANES);
        if let Some(planes) = made.iter().find(|p| p.dim == dim) {
            return Arc::clone(planes);
        }
        let planes = Arc::new(Planes::new(dim));
        made.push(Arc::clone(&planes));
        planes
    }

    /// The plain loop, for the instruction set the dispatch enabled: the 128 sums in two halves of
    /// 64, each a pass over the vector, so one half's sums fit in AVX2's sixteen registers.
    #[inline(always)]
    fn sketch_of(&self, value: impl Fn(usize) -> f32) -> Sketch {
        const HALF: usize = BITS / 2;
        let mut out = [0u64; 2];
        for (half, word) in out.iter_mut().enumerate() {
            let mut sums = [0.0f32; HALF];
            for (j, normals) in self.by_coordinate.chunks_exact(BITS).enumerate() {
                let x = value(j);
                for (sum, n) in sums.iter_mut().zip(&normals[half * HALF..]) {
                    *sum += x * n;
                }
            }
            for (bit, sum) in sums.iter().enumerate() {
                if *sum >= 0.0 {
                    *word |= 1 << bit;
                }
            }
        }
        out
    }

    /// [`Planes::sketch_of`] through the AVX-512 kernel on a CPU that has it, else the plain
    /// loop compiled for the best instruction set there is.
    #[inline(always)]
    fn dispatched(&self, value: impl Fn(usize) -> f32) -> Sketch {
        ARCH.dispatch(Sketching {
            planes: self,
            value,
        })
    }

    /// The sketch of an f32 vector of this dimension (missing values count as 0).
    pub fn sketch(&self, v: &[f32]) -> Sketch {
        self.dispatched(|j| v.get(j).copied().unwrap_or(0.0))
    }

    /// The sketch of a row of f16 codes of this dimension.
    pub fn sketch_row(&self, row: &[f16]) -> Sketch {
        self.dispatched(|j| row.get(j).map_or(0.0, |h| widen(h.to_bits())))
    }
}

/// Every row's sketch, computed on all cores (about 1.7 s of CPU per million rows) of the index's
/// build pool: its threads run at the lower priority of the loads and builds this is part of,
/// where rayon's global pool would take the cores from the requests served meanwhile.
pub fn sketch_all(codes: &[f16], dim: usize) -> Vec<Sketch> {
    let planes = Planes::of(dim);
    let sketch = || {
        let mut sketches = Vec::new();
        codes
            .par_chunks_exact(dim.max(1))
            .with_min_len(1_024)
            .map(|row| planes.sketch_row(row))
            .collect_into_vec(&mut sketches);
        sketches
    };
    super::pools::on_build_threads(sketch)
}

static ARCH: LazyLock<Arch> = LazyLock::new(Arch::new);

/// One sketch as a `pulp` operation (see [`Nearest`] for why a struct).
struct Sketching<'a, F> {
    planes: &'a Planes,
    value: F,
}

impl<F: Fn(usize) -> f32> WithSimd for Sketching<'_, F> {
    type Output = Sketch;

    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) -> Sketch {
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V4::try_new() {
            return avx512::sketch(simd, &self.planes.by_coordinate, self.value);
        }
        self.planes.sketch_of(self.value)
    }
}

/// AVX-512: the 128 sums in eight registers, one fused multiply-add each per coordinate. Compiled
/// into every variant the dispatch makes but reached only with a `V4` token, which exists only on
/// a CPU that has the features. On such a CPU the dispatch picks V4 itself, so the kernel runs
/// inlined where the features are enabled.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Sketch, BITS};
    use pulp::x86::V4;

    #[inline(always)]
    pub(super) fn sketch(simd: V4, by_coordinate: &[f32], value: impl Fn(usize) -> f32) -> Sketch {
        let f = simd.avx512f;
        let mut sums = [f._mm512_setzero_ps(); BITS / 16];
        for (j, normals) in by_coordinate.chunks_exact(BITS).enumerate() {
            let x = f._mm512_set1_ps(value(j));
            let (normals, _) = normals.as_chunks::<16>();
            for (sum, n) in sums.iter_mut().zip(normals) {
                *sum = f._mm512_fmadd_ps(x, bytemuck::cast(*n), *sum);
            }
        }
        let mut out = [0u64; 2];
        for (i, sum) in sums.iter().enumerate() {
            let lanes: [f32; 16] = bytemuck::cast(*sum);
            for (lane, v) in lanes.iter().enumerate() {
                if *v >= 0.0 {
                    out[i / 4] |= 1 << ((i % 4) * 16 + lane);
                }
            }
        }
        out
    }
}

/// The `k` rows of `sketches` (numbered from `first`) that differ from `query` in the fewest bits
/// among those `keep` accepts, as `(differing bits, row)`, fewest first (ties: the lower row). `keep`
/// is asked only about a row that would enter the `k` kept so far (a few hundred of a million), so
/// it can be a lookup: removed rows then never take the place of a live one.
pub fn nearest(
    sketches: &[Sketch],
    first: u32,
    query: Sketch,
    k: usize,
    keep: impl Fn(u32) -> bool,
) -> Vec<(u32, u32)> {
    if k == 0 {
        return Vec::new();
    }
    let scan = Nearest {
        sketches,
        first,
        query,
        k,
        keep,
    };
    #[cfg(target_arch = "x86_64")]
    let mut kept = match Popcnt512::try_new() {
        Some(simd) => simd.vectorize(scan),
        None => ARCH.dispatch(scan),
    };
    #[cfg(not(target_arch = "x86_64"))]
    let mut kept = ARCH.dispatch(scan);
    kept.sort_unstable();
    kept
}

#[cfg(target_arch = "x86_64")]
pulp::simd_type!({
    /// AVX-512 with its vector population count (`vpopcntq`; Ice Lake, Zen 4 and later), which
    /// `pulp`'s `V4` leaves out. Made by `pulp`'s own macro, as `V4` is, so the check of the CPU
    /// and the enabling of the features stay `pulp`'s: with them, the compiler counts the bits of
    /// eight words per instruction, where `V4` alone counts them with byte shuffles at half the
    /// speed (a million sketches: 0.34-0.37 ms against 0.54-0.57 ms on one core when in cache).
    struct Popcnt512 {
        avx512f: f!("avx512f"),
        avx512vl: f!("avx512vl"),
        avx512vpopcntdq: f!("avx512vpopcntdq"),
        popcnt: f!("popcnt"),
    }
});

/// Rows whose differing bits are counted before one test against the worst kept: a block's
/// minimum is a reduction the compiler keeps in vector registers, and a block that holds no row
/// better than the worst (nearly all, once the kept set has filled) costs no branch per row.
const BLOCK: usize = 16;

/// [`nearest`]'s scan as a `pulp` operation: compiled for this CPU's instruction set (`popcnt`
/// rather than a dozen shifts and masks per word). A struct, not a closure: `pulp` inlines its
/// `with_simd` into the function the features are enabled for, where a closure's body was left a
/// call of its own, compiled for baseline x86-64.
struct Nearest<'a, F> {
    sketches: &'a [Sketch],
    first: u32,
    query: Sketch,
    k: usize,
    keep: F,
}

impl<F: Fn(u32) -> bool> Nearest<'_, F> {
    #[inline(always)]
    fn scan(self) -> Vec<(u32, u32)> {
        let Nearest {
            sketches,
            first,
            query,
            k,
            keep,
        } = self;
        let differing =
            |s: &Sketch| (s[0] ^ query[0]).count_ones() + (s[1] ^ query[1]).count_ones();
        let mut kept: BinaryHeap<(u32, u32)> = BinaryHeap::with_capacity(k + 1);
        let mut worst = u32::MAX;
        let mut visit = |s: &Sketch, row: u32, worst: &mut u32| {
            let bits = differing(s);
            if bits < *worst && keep(row) {
                kept.push((bits, row));
                if kept.len() > k {
                    kept.pop();
                }
                if kept.len() == k {
                    *worst = kept.peek().map_or(u32::MAX, |w| w.0);
                }
            }
        };
        let (blocks, rest) = sketches.as_chunks::<BLOCK>();
        // Rows after the sketches, so the row count never steps past the last one.
        let mut rows = first..;
        for block in blocks {
            let fewest = block.iter().fold(u32::MAX, |m, s| m.min(differing(s)));
            if fewest < worst {
                for (s, row) in block.iter().zip(rows.by_ref()) {
                    visit(s, row, &mut worst);
                }
            } else {
                rows.nth(BLOCK - 1);
            }
        }
        for (s, row) in rest.iter().zip(rows) {
            visit(s, row, &mut worst);
        }
        kept.into_vec()
    }
}

/// A `pulp` operation (`WithSimd` too, by `pulp`'s blanket impl), for either token.
impl<F: Fn(u32) -> bool> pulp::NullaryFnOnce for Nearest<'_, F> {
    type Output = Vec<(u32, u32)>;

    #[inline(always)]
    fn call(self) -> Self::Output {
        self.scan()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::quant::encode_f16;

    /// A plain dot product (the index's own lives a floor up: importing it would close a circle).
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    fn unit(state: &mut u64, dim: usize) -> Vec<f32> {
        let v: Vec<f32> = (0..dim)
            .map(|_| uniform(state) as f32 * 2.0 - 1.0)
            .collect();
        let n = dot(&v, &v).sqrt();
        v.into_iter().map(|x| x / n).collect()
    }

    /// `v` moved toward `w` so that it sits at cosine `c` from `v`'s old direction (w ⟂ v).
    fn at_cosine(v: &[f32], w: &[f32], c: f32) -> Vec<f32> {
        let along = dot(w, v);
        let orth: Vec<f32> = w.iter().zip(v).map(|(w, v)| w - along * v).collect();
        let n = dot(&orth, &orth).sqrt();
        let s = (1.0 - c * c).sqrt();
        v.iter()
            .zip(&orth)
            .map(|(v, o)| c * v + s * o / n)
            .collect()
    }

    fn differing(a: Sketch, b: Sketch) -> u32 {
        (a[0] ^ b[0]).count_ones() + (a[1] ^ b[1]).count_ones()
    }

    #[test]
    fn differing_bits_follow_the_angle() {
        let planes = Planes::of(384);
        let mut state = 11;
        for (cosine, low, high) in [(0.96f32, 6.0, 18.0), (0.5, 34.0, 52.0), (0.0, 55.0, 73.0)] {
            // The mean over 200 pairs: θ/π · 128 (11.6, 42.7, 64), within about 3σ of a mean.
            let mean = (0..200)
                .map(|_| {
                    let (v, w) = (unit(&mut state, 384), unit(&mut state, 384));
                    let u = at_cosine(&v, &w, cosine);
                    f64::from(differing(planes.sketch(&v), planes.sketch(&u)))
                })
                .sum::<f64>()
                / 200.0;
            assert!(
                (low..high).contains(&mean),
                "cosine {cosine}: {mean} bits differ on average"
            );
        }
    }

    #[test]
    fn the_planes_are_fixed_and_rows_sketch_like_their_vectors() {
        let a = Planes::new(16);
        assert!(Arc::ptr_eq(&Planes::of(16), &Planes::of(16)));
        assert_eq!(a.by_coordinate, Planes::of(16).by_coordinate);
        let mut state = 5;
        let vs: Vec<Vec<f32>> = (0..20).map(|_| unit(&mut state, 16)).collect();
        let codes: Vec<f16> = vs.iter().flat_map(|v| encode_f16(v)).collect();
        let rows: Vec<Sketch> = codes.chunks_exact(16).map(|r| a.sketch_row(r)).collect();
        // An f16 row rounds its values, which can only flip a bit whose plane passes within
        // rounding of the vector: rare, and never more than a few bits.
        for (v, s) in vs.iter().zip(&rows) {
            assert!(differing(a.sketch(v), *s) <= 2);
        }
        assert_eq!(rows.len(), 20);
    }

    #[test]
    fn the_dispatched_kernel_agrees_with_the_plain_loop() {
        let planes = Planes::of(384);
        let mut state = 13;
        // Sums add in another order in the AVX-512 kernel: only a sum within rounding of 0 can
        // land on the other side.
        let differ: u32 = (0..100)
            .map(|_| {
                let v = unit(&mut state, 384);
                differing(planes.sketch(&v), planes.sketch_of(|j| v[j]))
            })
            .sum();
        assert!(differ <= 3, "{differ} bits differ over 100 vectors");
    }

    /// The scan in blocks of [`BLOCK`] rows keeps what a sort of every row keeps: the `k` fewest
    /// differing, ties to the lower row, `keep` honoured, over blocks, a tail, and k larger than
    /// a block or than the rows.
    #[test]
    fn nearest_in_blocks_keeps_what_a_sort_keeps() {
        let mut state = 21;
        let query = [splitmix(&mut state), splitmix(&mut state)];
        // Rows near the query (few flipped bits) scattered among unrelated ones, many ties.
        let sketches: Vec<Sketch> = (0..5_003)
            .map(|i| {
                let r = [splitmix(&mut state), splitmix(&mut state)];
                if i % 97 == 5 {
                    [query[0] ^ (r[0] & r[1] & 0x0101_0101), query[1]]
                } else {
                    r
                }
            })
            .collect();
        let keep = |row: u32| row % 3 != 1;
        for (len, k) in [
            (5_003, 64),
            (5_003, 1),
            (5_003, 17),
            (40, 64),
            (16, 3),
            (15, 3),
        ] {
            let rows = &sketches[..len];
            let mut sorted: Vec<(u32, u32)> = rows
                .iter()
                .zip(100..)
                .map(|(s, row)| (differing(*s, query), row))
                .filter(|(_, row)| keep(*row))
                .collect();
            sorted.sort_unstable();
            sorted.truncate(k);
            assert_eq!(
                nearest(rows, 100, query, k, keep),
                sorted,
                "{len} rows, k {k}"
            );
        }
    }

    #[test]
    fn nearest_keeps_the_fewest_differing_rows_in_order() {
        let query = [0u64, 0];
        let sketches: Vec<Sketch> = vec![[0b111, 0], [0, 0], [1, 1], [u64::MAX, 0], [0b1, 0]];
        let all = |_| true;
        assert_eq!(
            nearest(&sketches, 10, query, 3, all),
            [(0, 11), (1, 14), (2, 12)]
        );
        assert_eq!(nearest(&sketches, 0, query, 0, all), []);
        assert_eq!(nearest(&sketches, 0, query, 9, all).len(), 5);
        assert_eq!(nearest(&[], 0, query, 3, all), []);
        // Rows `keep` refuses never take a place: the next fewest do.
        assert_eq!(
            nearest(&sketches, 10, query, 3, |row| row != 11),
            [(1, 14), (2, 12), (3, 10)]
        );
    }
}
