//! The compact vector forms: f16 (what the index holds) and int8 codes with a per-vector scale
//! (measured against it, and what a sealed graph's walk reads: [`encode_i8_f16`], [`dot_f32_i8`]),
//! with the distances `hnsw_rs` computes on them. No index state here.
//!
//! Why f16: a 384-d f32 vector is 1,536 bytes; as f16 it is 768, as int8 384. Both were measured
//! against f32 (`benches/benches/scale.rs quant`, `benches/results/2026-12-05-scale.md`): on 3,000
//! MiniLM embeddings of fow-cache texts, each the query for its nearest other, f16 kept recall@1
//! 0.990 and int8 0.988 (0.982 and 0.979 on random and clustered unit vectors, f16 0.999 and
//! 1.000), so the index holds f16.
//!
//! The f16 dot products pick their loop at run time (`pulp`; the build targets baseline x86-64):
//! on a CPU with AVX-512, `vcvtph2ps` widens 16 f16 per instruction into fused multiply-adds (30 ns
//! per 384-d f16 · f16 call against 231 ns for the baseline loop, faster than the baseline f32
//! [`dot`](super::dot)'s 38 ns: `benches/results/2026-12-05-scale-1m.md`); elsewhere the plain loop
//! (`widen`) is compiled for AVX2 or SSE2, whichever the CPU has.
//!
//! An int8 code is `round(v · 127 / max|v|)`: the scale is per vector, so every vector uses the
//! whole int8 range. Cosine does not depend on the scale, so `DistI8` needs none: it divides by the
//! codes' own norms, computed in the same pass as the dot product. A sealed graph's walk keeps each
//! row's step (`max|v| / 127`), which turns the f32 query's dot product with the codes into one with
//! the row.

use std::sync::LazyLock;

use half::f16;
use half::slice::HalfFloatSliceExt;
use hnsw_rs::prelude::Distance;
use pulp::Arch;

/// Elements per chunk of the vectorized loops: 32 int8 lanes fill one AVX2 register.
const LANES: usize = 32;

/// Int8 codes of `v` with a per-vector scale (`127 / max|v|`); a zero vector gives zero codes.
pub fn encode_i8(v: &[f32]) -> Vec<i8> {
    let mut codes = vec![0; v.len()];
    encode_i8_into(v.iter().copied(), &mut codes);
    codes
}

/// The int8 codes of an f16 row into `out` (as [`encode_i8`] of the f32 vector it stands for), and
/// the step that turns them back: `code · step ≈ value`, so `dot_f32_i8(q, codes) · step ≈ q·v`
/// ([`dot_f32_i8`]). 0 (and zero codes) for a zero row, or one with a value that is not finite.
pub fn encode_i8_f16(row: &[f16], out: &mut [i8]) -> f32 {
    // Compiled for the CPU's vector instructions: a restart encodes every sealed row (a million at
    // 1M entries), and baseline x86-64 rounds each value in a call to libm.
    ARCH.dispatch(|| {
        // `widen` is exact for finite values only: an infinity or NaN (a damaged segment) zeroes
        // the row.
        if row.iter().any(|h| !h.is_finite()) {
            out.fill(0);
            return 0.0;
        }
        encode_i8_into(row.iter().map(|h| widen(h.to_bits())), out)
    })
}

/// Inlined, so [`encode_i8_f16`]'s dispatch compiles it for the CPU.
#[inline(always)]
fn encode_i8_into(values: impl Iterator<Item = f32> + Clone, out: &mut [i8]) -> f32 {
    // `f32::max` passes over a NaN, which then encodes as 0 (`as` maps NaN to 0).
    let max = values.clone().fold(0.0f32, |m, x| m.max(x.abs()));
    if !(max > 0.0 && max.is_finite()) {
        out.fill(0);
        return 0.0;
    }
    let scale = 127.0 / max;
    for (o, x) in out.iter_mut().zip(values) {
        // `as` saturates; the value is already within ±127.
        *o = (x * scale).round() as i8;
    }
    max / 127.0
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

/// The f16 form of a vector (round to nearest).
pub fn encode_f16(v: &[f32]) -> Vec<f16> {
    let mut out = vec![f16::ZERO; v.len()];
    out.convert_from_f32_slice(v);
    out
}

/// The f32 vector an f16 row stands for.
pub fn decode_f16(row: &[f16]) -> Vec<f32> {
    let mut out = vec![0.0; row.len()];
    row.convert_to_f32_slice(&mut out);
    out
}

/// f16 → f32 in plain integer and float operations that LLVM vectorizes without F16C (the
/// build targets baseline x86-64; `half`'s slice conversion checks for F16C at run time per call
/// and measured 7× slower than an f32 dot product): the f16 exponent and mantissa are moved into
/// f32 position, and one multiplication by 2^112 rebiases the exponent (also turning f16
/// subnormals into the right f32 normals, and zero into zero). Exact for every finite f16; the
/// index never holds infinities or NaN.
#[inline(always)]
pub(super) fn widen(h: u16) -> f32 {
    const REBIAS: f32 = 5.192_297e33; // 2^112
    let h = u32::from(h);
    let magnitude = f32::from_bits((h & 0x7fff) << 13) * REBIAS;
    f32::from_bits(magnitude.to_bits() | ((h & 0x8000) << 16))
}

/// Independent f32 accumulators of the f16 and int8 loops, one 512-bit register of f32 (see
/// [`dot`](super::dot)).
const LANES_F32: usize = 16;

/// The best instruction set of this CPU, detected once (`pulp`): the loops below are compiled
/// for it and chosen at run time, so the binary still targets baseline x86-64.
static ARCH: LazyLock<Arch> = LazyLock::new(Arch::new);

/// Dot product of an f32 query with an f16 row.
pub fn dot_f32_f16(query: &[f32], row: &[f16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if let Arch::V4(simd) = *ARCH {
        return simd.vectorize(|| avx512::dot_f32_f16(simd, query, row));
    }
    ARCH.dispatch(|| portable_dot_f32_f16(query, row))
}

/// Dot product of two f16 rows.
pub fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if let Arch::V4(simd) = *ARCH {
        return simd.vectorize(|| avx512::dot_f16(simd, a, b));
    }
    ARCH.dispatch(|| portable_dot_f16(a, b))
}

/// Dot product of an f32 query with int8 codes, in code units: times the codes' step
/// ([`encode_i8_f16`]), the query's dot product with the vector they encode.
pub fn dot_f32_i8(query: &[f32], code: &[i8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if let Arch::V4(simd) = *ARCH {
        return simd.vectorize(|| avx512::dot_f32_i8(simd, query, code));
    }
    ARCH.dispatch(|| portable_dot_f32_i8(query, code))
}

/// The plain loop of [`dot_f32_i8`].
#[inline(always)]
fn portable_dot_f32_i8(query: &[f32], code: &[i8]) -> f32 {
    portable_dot(query, code, |q| q, f32::from)
}

/// The plain loops: [`widen`] vectorizes with whatever the dispatch enabled (SSE2, AVX2). Public so
/// benches can time them called directly, i.e. compiled for baseline x86-64 (the form before dispatch).
#[inline(always)]
pub fn portable_dot_f32_f16(query: &[f32], row: &[f16]) -> f32 {
    portable_dot(query, row, |q| q, |r| widen(r.to_bits()))
}

#[inline(always)]
pub fn portable_dot_f16(a: &[f16], b: &[f16]) -> f32 {
    let widen = |h: f16| widen(h.to_bits());
    portable_dot(a, b, widen, widen)
}

/// The dot product of `a` and `b` as `fa` and `fb` turn their values into f32, in
/// [`LANES_F32`] independent accumulators.
#[inline(always)]
fn portable_dot<A: Copy, B: Copy>(
    a: &[A],
    b: &[B],
    fa: impl Fn(A) -> f32,
    fb: impl Fn(B) -> f32,
) -> f32 {
    let n = a.len().min(b.len());
    let (ca, ta) = a[..n].as_chunks::<LANES_F32>();
    let (cb, tb) = b[..n].as_chunks::<LANES_F32>();
    let mut acc = [0.0f32; LANES_F32];
    for (x, y) in ca.iter().zip(cb) {
        for i in 0..LANES_F32 {
            acc[i] += fa(x[i]) * fb(y[i]);
        }
    }
    let tail: f32 = ta.iter().zip(tb).map(|(x, y)| fa(*x) * fb(*y)).sum();
    acc.iter().sum::<f32>() + tail
}

/// AVX-512 kernels: `vcvtph2ps` widens 16 f16 at once (`vpmovsxbd` and `vcvtdq2ps` 16 int8), four
/// fused multiply-add chains hide the FMA latency. Only called inside `V4::vectorize`, which enables
/// the features they are compiled for.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{portable_dot_f16, portable_dot_f32_f16, portable_dot_f32_i8, LANES_F32};
    use core::arch::x86_64::__m512;
    use half::f16;
    use pulp::x86::V4;

    /// Elements per unrolled step: four registers of 16.
    const STEP: usize = 4 * LANES_F32;

    /// The dot product of `a` and `b`, 16 lanes at a time as `widen_a` and `widen_b` turn them
    /// into f32 registers, four fused multiply-add chains; the tail by `tail`.
    #[inline(always)]
    fn dot<A: Copy, B: Copy>(
        simd: V4,
        a: &[A],
        b: &[B],
        widen_a: impl Fn([A; LANES_F32]) -> __m512,
        widen_b: impl Fn([B; LANES_F32]) -> __m512,
        tail: impl Fn(&[A], &[B]) -> f32,
    ) -> f32 {
        let f = simd.avx512f;
        let n = a.len().min(b.len());
        let (ca, ta) = a[..n].as_chunks::<STEP>();
        let (cb, tb) = b[..n].as_chunks::<STEP>();
        let mut acc = [f._mm512_setzero_ps(); 4];
        for (x, y) in ca.iter().zip(cb) {
            let (xs, _) = x.as_chunks::<LANES_F32>();
            let (ys, _) = y.as_chunks::<LANES_F32>();
            for ((acc, x), y) in acc.iter_mut().zip(xs).zip(ys) {
                *acc = f._mm512_fmadd_ps(widen_a(*x), widen_b(*y), *acc);
            }
        }
        let sum = f._mm512_add_ps(
            f._mm512_add_ps(acc[0], acc[1]),
            f._mm512_add_ps(acc[2], acc[3]),
        );
        f._mm512_reduce_add_ps(sum) + tail(ta, tb)
    }

    #[inline(always)]
    pub(super) fn dot_f16(simd: V4, a: &[f16], b: &[f16]) -> f32 {
        let f = simd.avx512f;
        let widen = |x: [f16; LANES_F32]| f._mm512_cvtph_ps(bytemuck::cast(x));
        dot(simd, a, b, widen, widen, portable_dot_f16)
    }

    #[inline(always)]
    pub(super) fn dot_f32_f16(simd: V4, query: &[f32], row: &[f16]) -> f32 {
        let f = simd.avx512f;
        let widen = |r: [f16; LANES_F32]| f._mm512_cvtph_ps(bytemuck::cast(r));
        dot(
            simd,
            query,
            row,
            bytemuck::cast,
            widen,
            portable_dot_f32_f16,
        )
    }

    /// 16 codes at a time: sign-extended to i32 (`vpmovsxbd`), converted to f32, multiplied in.
    #[inline(always)]
    pub(super) fn dot_f32_i8(simd: V4, query: &[f32], code: &[i8]) -> f32 {
        let f = simd.avx512f;
        let widen =
            |c: [i8; LANES_F32]| f._mm512_cvtepi32_ps(f._mm512_cvtepi8_epi32(bytemuck::cast(c)));
        dot(
            simd,
            query,
            code,
            bytemuck::cast,
            widen,
            portable_dot_f32_i8,
        )
    }
}

/// Cosine similarity of two f16 rows (their own norms, so unnormalized rows work too).
pub fn cosine_f16(a: &[f16], b: &[f16]) -> f32 {
    let denominator = (dot_f16(a, a) * dot_f16(b, b)).sqrt();
    if denominator > 0.0 {
        dot_f16(a, b) / denominator
    } else {
        0.0
    }
}

/// `hnsw_rs` distance on f16 rows of unit vectors: `1 - a·b` (f16 keeps a unit vector's norm
/// within 1e-3), clamped at 0 like [`DistI8`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DistF16;

impl Distance<f16> for DistF16 {
    fn eval(&self, a: &[f16], b: &[f16]) -> f32 {
        (1.0 - dot_f16(a, b)).max(0.0)
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
                assert!(
                    (dot_f32_f16(&a, &hb) - exact).abs() < 0.002,
                    "f32·f16 d={d}"
                );
                assert!((1.0 - DistF16.eval(&ha, &hb) - exact).abs() < 0.002);
                // The dispatched kernel (AVX-512 on a CPU that has it) and the plain loop agree.
                assert!((dot_f16(&ha, &hb) - portable_dot_f16(&ha, &hb)).abs() < 1e-5);
                assert!((dot_f32_f16(&a, &hb) - portable_dot_f32_f16(&a, &hb)).abs() < 1e-5);
                assert!(DistF16.eval(&ha, &ha) < 0.002);
                // A vector is its own nearest: distance 0 (clamped, never negative).
                assert_eq!(DistI8.eval(&ia, &ia), 0.0);
            }
        }
    }

    /// A sealed graph's walk scores rows by their int8 codes: within a few thousandths of the f16
    /// row's similarity, the AVX-512 kernel agreeing with the plain loop.
    #[test]
    fn int8_codes_of_f16_rows_keep_the_similarity_within_their_step() {
        let mut rng = StdRng::seed_from_u64(9);
        for d in [1, 15, 16, 17, 64, 65, 384] {
            for _ in 0..50 {
                let (q, v) = (unit(&mut rng, d), unit(&mut rng, d));
                let row = encode_f16(&v);
                let mut codes = vec![0i8; d];
                let step = encode_i8_f16(&row, &mut codes);
                let max = decode_f16(&row).iter().fold(0.0f32, |m, x| m.max(x.abs()));
                assert!((step - max / 127.0).abs() <= f32::EPSILON * max, "d={d}");
                assert!(
                    codes.iter().any(|c| c.abs() == 127),
                    "the largest value is ±127"
                );
                for (c, x) in codes.iter().zip(decode_f16(&row)) {
                    assert!((f32::from(*c) * step - x).abs() <= step / 2.0 + 1e-6);
                }
                let walk = dot_f32_i8(&q, &codes) * step;
                let exact = dot_f32_f16(&q, &row);
                // Each value is off by at most half a step, against a unit query.
                assert!((walk - exact).abs() < 0.01, "d={d}: {walk} vs {exact}");
                assert!((dot_f32_i8(&q, &codes) - portable_dot_f32_i8(&q, &codes)).abs() < 1e-3);
            }
        }
        // A zero row, or one with a value that is not finite (a damaged segment), walks as
        // similarity 0, never NaN.
        for bad in [f16::ZERO, f16::NAN, f16::INFINITY] {
            let row = [f16::from_f32(0.5), bad, f16::from_f32(-0.25)];
            let mut codes = [1i8; 3];
            let step = encode_i8_f16(&row, &mut codes);
            if bad == f16::ZERO {
                assert_eq!(codes, [127, 0, -64]);
                continue;
            }
            assert_eq!((codes, step), ([0; 3], 0.0));
        }
        let mut codes = [1i8; 2];
        assert_eq!(encode_i8_f16(&[f16::ZERO; 2], &mut codes), 0.0);
        assert_eq!(codes, [0; 2]);
    }

    #[test]
    fn widen_is_exact_for_every_finite_f16() {
        for bits in 0..=u16::MAX {
            let h = f16::from_bits(bits);
            if h.is_finite() {
                assert_eq!(widen(bits).to_bits(), h.to_f32().to_bits(), "{bits:#06x}");
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
        assert_eq!(
            decode_f16(&encode_f16(&v)),
            v,
            "these values are exact in f16"
        );
    }
}
