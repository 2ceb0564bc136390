//! The compact vector forms the index holds: int8 codes with a per-vector scale (kept) and f16
//! (measured against it), with the distances `hnsw_rs` computes on them. No index state here.
//!
//! Why int8: a 384-d f32 vector is 1,536 bytes; as int8 it is 384, as f16 768. Both were measured
//! against f32 on real MiniLM embeddings and on random and clustered unit vectors
//! (`benches/benches/scale.rs quant`, results in `benches/results/2026-12-05-scale.md`); int8 held
//! recall@1 ≥ 0.99 and costs half of f16.
//!
//! A code is `round(v · 127 / max|v|)`: the scale is per vector, so every vector uses the whole
//! int8 range. Cosine similarity does not depend on the scale, so it is not stored: the distance
//! divides by the codes' own norms, computed in the same pass as the dot product. All loops are
//! written over fixed-size chunks with independent integer accumulators so LLVM vectorizes them
//! (integer sums may be reassociated; the f32 ones use separate lanes).

use half::f16;
use hnsw_rs::prelude::Distance;

/// Elements per chunk of the vectorized loops: 32 int8 lanes fill one AVX2 register.
const LANES: usize = 32;

/// Int8 codes of `v` with a per-vector scale (`127 / max|v|`); a zero vector gives zero codes.
pub fn encode_i8(v: &[f32]) -> Vec<i8> {
    let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let scale = if max > 0.0 && max.is_finite() {
        127.0 / max
    } else {
        0.0
    };
    // `as` saturates; the value is already within ±127.
    v.iter().map(|x| (x * scale).round() as i8).collect()
}

/// The f32 vector a code stands for, L2-normalized (the scale is not needed for cosine).
pub fn decode_i8(code: &[i8]) -> Vec<f32> {
    let norm = (sums_i8(code, code).0 as f32).sqrt();
    let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
    code.iter().map(|c| f32::from(*c) * inv).collect()
}

/// `(a·b, a·a, b·b)` over int8 codes, in i32: one pass, vectorized (i8 → i16 multiply-add → i32).
/// 384 products of at most 127² each fit an i32 many times over.
fn sums_i8(a: &[i8], b: &[i8]) -> (i32, i32, i32) {
    let n = a.len().min(b.len());
    let (ca, ta) = a[..n].as_chunks::<LANES>();
    let (cb, tb) = b[..n].as_chunks::<LANES>();
    let mut ab = [0i32; LANES];
    let mut aa = [0i32; LANES];
    let mut bb = [0i32; LANES];
    for (x, y) in ca.iter().zip(cb) {
        for i in 0..LANES {
            let (x, y) = (i32::from(x[i]), i32::from(y[i]));
            ab[i] += x * y;
            aa[i] += x * x;
            bb[i] += y * y;
        }
    }
    let mut sums = (
        ab.iter().sum::<i32>(),
        aa.iter().sum::<i32>(),
        bb.iter().sum::<i32>(),
    );
    for (x, y) in ta.iter().zip(tb) {
        let (x, y) = (i32::from(*x), i32::from(*y));
        sums.0 += x * y;
        sums.1 += x * x;
        sums.2 += y * y;
    }
    sums
}

/// Cosine similarity of two int8 codes.
pub fn cosine_i8(a: &[i8], b: &[i8]) -> f32 {
    let (ab, aa, bb) = sums_i8(a, b);
    let denominator = (aa as f32 * bb as f32).sqrt();
    if denominator > 0.0 {
        ab as f32 / denominator
    } else {
        0.0
    }
}

/// Cosine similarity of a unit f32 query with an int8 code (the asymmetric form: the query loses
/// nothing to quantization, so re-ranking with it is more exact than [`cosine_i8`]).
pub fn cosine_f32_i8(query: &[f32], code: &[i8]) -> f32 {
    const F: usize = 16;
    let n = query.len().min(code.len());
    let (cq, tq) = query[..n].as_chunks::<F>();
    let (cc, tc) = code[..n].as_chunks::<F>();
    let mut qc = [0.0f32; F];
    let mut cc2 = [0i32; F];
    for (q, c) in cq.iter().zip(cc) {
        for i in 0..F {
            qc[i] += q[i] * f32::from(c[i]);
            cc2[i] += i32::from(c[i]) * i32::from(c[i]);
        }
    }
    let mut dot = qc.iter().sum::<f32>();
    let mut norm2 = cc2.iter().sum::<i32>();
    for (q, c) in tq.iter().zip(tc) {
        dot += q * f32::from(*c);
        norm2 += i32::from(*c) * i32::from(*c);
    }
    if norm2 > 0 {
        dot / (norm2 as f32).sqrt()
    } else {
        0.0
    }
}

/// `hnsw_rs` distance on int8 codes: `1 - cosine`, clamped at 0 (`hnsw_rs` asserts distances are
/// non-negative and panics on NaN; `max` maps a NaN to 0).
#[derive(Debug, Clone, Copy, Default)]
pub struct DistI8;

impl Distance<i8> for DistI8 {
    fn eval(&self, a: &[i8], b: &[i8]) -> f32 {
        (1.0 - cosine_i8(a, b)).max(0.0)
    }
}

/// f16 form of a vector (measured, not used by the index).
pub fn encode_f16(v: &[f32]) -> Vec<f16> {
    v.iter().map(|x| f16::from_f32(*x)).collect()
}

/// Cosine similarity of two f16 vectors, widened to f32 chunk by chunk.
pub fn cosine_f16(a: &[f16], b: &[f16]) -> f32 {
    const F: usize = 16;
    let n = a.len().min(b.len());
    let (ca, ta) = a[..n].as_chunks::<F>();
    let (cb, tb) = b[..n].as_chunks::<F>();
    let (mut ab, mut aa, mut bb) = ([0.0f32; F], [0.0f32; F], [0.0f32; F]);
    for (x, y) in ca.iter().zip(cb) {
        for i in 0..F {
            let (x, y) = (x[i].to_f32(), y[i].to_f32());
            ab[i] += x * y;
            aa[i] += x * x;
            bb[i] += y * y;
        }
    }
    let (mut ab, mut aa, mut bb) = (
        ab.iter().sum::<f32>(),
        aa.iter().sum::<f32>(),
        bb.iter().sum::<f32>(),
    );
    for (x, y) in ta.iter().zip(tb) {
        let (x, y) = (x.to_f32(), y.to_f32());
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    let denominator = (aa * bb).sqrt();
    if denominator > 0.0 {
        ab / denominator
    } else {
        0.0
    }
}

/// `hnsw_rs` distance on f16 vectors, for the measurement that chose int8.
#[derive(Debug, Clone, Copy, Default)]
pub struct DistF16;

impl Distance<f16> for DistF16 {
    fn eval(&self, a: &[f16], b: &[f16]) -> f32 {
        (1.0 - cosine_f16(a, b)).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn unit(rng: &mut StdRng, d: usize) -> Vec<f32> {
        let v: Vec<f32> = (0..d).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / n).collect()
    }

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn compact_cosines_track_f32_within_quantization_error() {
        let mut rng = StdRng::seed_from_u64(7);
        for d in [1, 5, 31, 33, 384] {
            for _ in 0..50 {
                let (a, b) = (unit(&mut rng, d), unit(&mut rng, d));
                let exact = cosine(&a, &b);
                let (ia, ib) = (encode_i8(&a), encode_i8(&b));
                assert!((cosine_i8(&ia, &ib) - exact).abs() < 0.02, "i8 d={d}");
                assert!(
                    (cosine_f32_i8(&a, &ib) - exact).abs() < 0.02,
                    "f32·i8 d={d}"
                );
                let (ha, hb) = (encode_f16(&a), encode_f16(&b));
                assert!((cosine_f16(&ha, &hb) - exact).abs() < 0.002, "f16 d={d}");
                // A vector is its own nearest: distance 0 (clamped, never negative).
                assert_eq!(DistI8.eval(&ia, &ia), 0.0);
            }
        }
    }

    #[test]
    fn scale_is_per_vector_and_zero_stays_zero() {
        // A vector 1000× smaller encodes to the same codes: the scale follows the vector.
        let v = vec![0.5, -0.25, 0.125];
        let small: Vec<f32> = v.iter().map(|x| x / 1000.0).collect();
        assert_eq!(encode_i8(&v), encode_i8(&small));
        assert_eq!(encode_i8(&v), vec![127, -64, 32]);
        assert_eq!(encode_i8(&[0.0; 4]), vec![0; 4]);
        assert_eq!(cosine_i8(&[0; 4], &[1; 4]), 0.0);
        assert_eq!(DistI8.eval(&[0; 4], &[1; 4]), 1.0);
        let back = decode_i8(&encode_i8(&v));
        assert!((cosine(&back, &back) - 1.0).abs() < 1e-5);
    }
}
