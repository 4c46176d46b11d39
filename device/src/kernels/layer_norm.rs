//! LayerNorm over fixed-width f16 rows: the row sum exact in f64, the mean
//! as two f32, deviations and biased variance in f32 (two passes over
//! registers, so no E[x^2] - mean^2 cancellation), output
//! `(x - mean) * rstd [* gamma + beta]` rounded once to f16. Every output is
//! within one f16 ulp of the exact value, constant rows give exactly 0 (or
//! `beta`); [`super::ln_stats`] has the computation and its error bound.
//! `rstd` comes from [`math::rsqrt`] (hardware on NVIDIA: within one f16 ulp
//! of the emulator's result, bit-identical on gfx9 and between emulator
//! modes).
//!
//! Layout: [`wavefuse_shared::RowLayout`] (a group of `L` lanes per row,
//! three 16-byte vectors per lane). Rows past the end are predicated off,
//! never returned early from: their lanes still join the group reductions.
use super::ln_affine::{
    KH_BETA, KH_GAMMA, OnePass, Precise, care_bits, compact_flags, exact, exact_factor,
    expand_flags, refine,
};
use super::ln_stats::{RowSums, Stats, group_sum_f64_n, mean_of, moments};
use crate::gpu;
use crate::math;
use crate::vec::{load8, load8_bits, pack8, store8, store8_bits, widen8};
use wavefuse_shared::{LN_PARK_BYTES, ROW_BLOCK, ln_block};

/// This lane's index in its row group and the group's row: groups of `L`
/// consecutive lanes, [`ROW_BLOCK`]` / L` rows per workgroup (the
/// [`wavefuse_shared::RowLayout`] launch shape every row kernel shares).
#[inline(always)]
pub fn group_row<const L: u32>() -> (usize, u64) {
    group_row_in::<L>(ROW_BLOCK)
}

/// [`group_row`] in workgroups of `block` threads (the affine entries:
/// [`wavefuse_shared::ln_block`]).
#[inline(always)]
pub fn group_row_in<const L: u32>(block: u32) -> (usize, u64) {
    let tid = gpu::thread_id();
    let lane = (tid % L) as usize;
    let row = u64::from(gpu::block_id()) * u64::from(block / L) + u64::from(tid / L);
    (lane, row)
}

/// One row group's LayerNorm.
///
/// # Safety
/// `x`, `y` valid for `rows * W` halves, `gamma`/`beta` for `W` halves when
/// `AFFINE`; all 16-byte aligned; with `AFFINE`, launch-sized workgroup
/// memory of [`wavefuse_shared::ln_shared_bytes`].
#[inline(always)]
#[allow(clippy::needless_range_loop)] // constant indices keep the row in registers
pub unsafe fn layer_norm<const W: usize, const L: u32, const NV: usize, const AFFINE: bool>(
    x: *const u16,
    y: *mut u16,
    gamma: *const u16,
    beta: *const u16,
    rows: u64,
    eps: f32,
) {
    let (lane, row) = group_row_in::<L>(ln_block(AFFINE));
    let active = row < rows;
    let base = row as usize * W;

    let mut v = [[0.0f32; 8]; NV];
    if active {
        for k in 0..NV {
            if in_row::<W, L, NV>(k, lane) {
                // SAFETY: row < rows and the vector lies inside the row.
                v[k] = unsafe { load8(x.add(base + (k * L as usize + lane) * 8)) };
            }
        }
    }
    let (st, sums, precise, one_pass) = moments::<W, L, NV, AFFINE>(&mut v, lane, eps);
    let io = RowIo {
        x: x.wrapping_add(base),
        y: y.wrapping_add(base),
        active,
    };
    // SAFETY: where active, row < rows: the row lies inside x and y.
    unsafe {
        normalise_store::<W, L, NV, AFFINE>(
            &v,
            st,
            sums,
            precise,
            one_pass,
            io,
            gamma,
            beta,
            eps,
            lane,
            Refine::Parked,
        )
    };
}

/// One output row's place in memory and whether this lane writes it.
#[derive(Clone, Copy)]
pub struct RowIo {
    /// The row's f16 inputs (the affine refinement reloads them): valid
    /// for `W` halves where `active`.
    pub x: *const u16,
    /// The row's outputs: valid for `W` halves where `active`.
    pub y: *mut u16,
    /// Whether this lane computes and stores the row (lanes that do not
    /// still call [`normalise_store`]: it may hold wave collectives).
    pub active: bool,
}

/// Where tiers 2 and 3 of the affine refinement ([`super::ln_affine`])
/// run and where the row's f64 sums wait for them across the fast loop
/// (a constant of each entry).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Refine {
    /// Inline, the sums in registers.
    Inline,
    /// Inline, the row sum and tier 1's root and `K`
    /// ([`super::ln_affine::OnePass`], so that tier 2 needs no Newton
    /// steps of its own) parked in workgroup memory
    /// ([`wavefuse_shared::LN_PARK_BYTES`] per thread, at the thread's own
    /// slot: no other thread reads it, so no barrier), read back only
    /// where a tier runs. The sums in registers cost the affine LayerNorm
    /// entries an 8-byte spill and 1-3% on the H200 with no output
    /// flagged; parked, the entries measured as fast as the kernels before
    /// the exact path there. The
    /// entry's launch must provide the memory
    /// ([`wavefuse_shared::ln_shared_bytes`]).
    Parked,
    /// In `refine_row` (a call on NVIDIA), the sums formed again there.
    Call,
}

/// Writes `(t - lo) * rstd [* gamma + beta]` as halves, `t` the lane's
/// [`super::ln_stats::offsets`] (`fma(t, rstd, shift)`, see [`Stats`]): its
/// `NV` vectors of one row (vector `k * L + lane`, those inside the row).
/// The affine step is one fused multiply-add (one rounding), refined where
/// it cancels ([`super::ln_affine`]; `sums`, `one_pass` and `eps` serve
/// that).
///
/// Every lane of the wave must call it (with `AFFINE`, a wave vote and
/// possibly group reductions); `io.active` says which lanes store.
/// `refine` (a constant of the entry) says where tiers 2 and 3 run and
/// where `sums` waits for them ([`Refine`]; with [`Refine::Call`] `sums`
/// is not used). `io.x` and `io.y` must not overlap (the host checks it).
///
/// # Safety
/// Where `io.active`, `io.x`/`io.y` valid for `W` halves and not
/// overlapping; `gamma`/`beta` valid for `W` halves when `AFFINE`; all
/// 16-byte aligned; `lane < L`; with `AFFINE` and [`Refine::Parked`],
/// launch-sized workgroup memory of [`wavefuse_shared::LN_PARK_BYTES`] per
/// thread.
#[inline(always)]
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
pub unsafe fn normalise_store<const W: usize, const L: u32, const NV: usize, const AFFINE: bool>(
    t: &[[f32; 8]; NV],
    st: Stats,
    sums: RowSums,
    precise: bool,
    one_pass: OnePass,
    io: RowIo,
    gamma: *const u16,
    beta: *const u16,
    eps: f32,
    lane: usize,
    refine: Refine,
) {
    let col = |k: usize| (k * L as usize + lane) * 8;
    if !AFFINE {
        if io.active {
            for k in 0..NV {
                if in_row::<W, L, NV>(k, lane) {
                    let mut o = [0.0f32; 8];
                    for i in 0..8 {
                        o[i] = math::fma(t[k][i], st.rstd, st.shift);
                    }
                    // SAFETY: col + 8 <= W.
                    unsafe { store8(io.y.add(col(k)), o) };
                }
            }
        }
        return;
    }
    // The fast outputs are stored at once (`x` and `y` never overlap, so
    // the tiers' reloads of `x` still see the inputs); tiers 2 and 3 then
    // overwrite the few outputs they redo, one half at a time, in program
    // order after the vector store of the same thread. Holding the
    // outputs in registers until a wave vote had decided measured about
    // 6% slower on the H200.
    const { assert!(NV <= 4) };
    // Volatile, so that the compiler cannot forward the stored values to
    // the tiers' reads (which would keep them in registers across the
    // loop). The slot is the three f64 the host's launch provides per
    // thread.
    const { assert!(LN_PARK_BYTES as usize == 3 * core::mem::size_of::<f64>()) };
    let park = gpu::workgroup_mem::<f64>().wrapping_add(3 * gpu::thread_id() as usize);
    if refine == Refine::Parked {
        // SAFETY: the thread's own 24 bytes of the launch's workgroup
        // memory (caller contract), 8-byte aligned.
        unsafe {
            park.write_volatile(sums.sum);
            park.add(1).write_volatile(one_pass.r);
            park.add(2).write_volatile(one_pass.k);
        }
    }
    // Tier 1's test on the packed f16 outputs ([`super::ln_affine`]): the
    // sign bits of each word flag its two outputs, gathered into `bits`
    // ([`compact_flags`]: byte moves and masks, no branch) while the words
    // are in registers, so the rare path reloads only the flagged outputs.
    // A branch around the gathering was if-converted by ptxas into about
    // 20 predicated instructions per vector; leaving it to the rare path
    // cost a reload per flagged lane.
    let mut bits = 0u32;
    if io.active {
        // Unrolled by hand: with the rare paths' loops over set bits LLVM
        // left this loop rolled, and `t` went to local memory.
        crate::unroll!(k in [0, 1, 2, 3] {
            if k < NV && in_row::<W, L, NV>(k, lane) {
                // SAFETY: col + 8 <= W.
                let (gw, bw) = unsafe { (load8_bits(gamma.add(col(k))), load8_bits(beta.add(col(k)))) };
                let (g, b) = (widen8(gw), widen8(bw));
                let mut z = [0.0f32; 8];
                for i in 0..8 {
                    let o = math::fma(t[k][i], st.rstd, st.shift);
                    z[i] = math::fma(o, g[i], b[i]);
                }
                let zw = pack8(z);
                let mut d = [0u32; 4];
                for j in 0..4 {
                    d[j] = gpu::below_scaled_h2(zw.0[j], bw.0[j], KH_BETA)
                        | gpu::below_scaled_h2(zw.0[j], gw.0[j], KH_GAMMA);
                }
                bits |= compact_flags(d) >> (2 * k);
                // SAFETY: col + 8 <= W.
                unsafe { store8_bits(io.y.add(col(k)), zw) };
            }
        });
    }
    // Rows without the row-precise statistics (a large offset, NaN, Inf):
    // every output through the f32-variance test, from reloaded inputs.
    let care = bits != 0 || (io.active && !precise);
    match refine {
        Refine::Call => {
            if gpu::wave_any(care) {
                // SAFETY: as for this function.
                unsafe {
                    refine_row::<W, L, NV>(
                        care, bits, precise, io.x, io.y, io.active, gamma, beta, lane, st.rstd, eps,
                    )
                };
            }
        }
        // SAFETY: as for this function; the thread's parked values (above).
        Refine::Parked => unsafe {
            let sum = || park.read_volatile();
            let factors = || {
                Precise::of_one_pass::<W>(OnePass {
                    r: park.add(1).read_volatile(),
                    k: park.add(2).read_volatile(),
                })
            };
            tiers::<W, L, NV>(
                care, bits, precise, io, gamma, beta, lane, sum, factors, st, eps,
            )
        },
        // SAFETY: as for this function.
        Refine::Inline => unsafe {
            let factors = || Precise::of::<W>(sums, st.rstd, eps);
            tiers::<W, L, NV>(
                care,
                bits,
                precise,
                io,
                gamma,
                beta,
                lane,
                || sums.sum,
                factors,
                st,
                eps,
            )
        },
    }
}

/// Tiers 2 and 3 ([`super::ln_affine`]) for the lane's flagged outputs
/// (`care`: the lane has some; `bits` and `precise` as in
/// [`normalise_store`]): inline there, or in `refine_row`. `sum` and
/// `factors` give the row's exact sum and tier 2's factors, called only
/// where a tier needs them. Every lane of the wave must call it.
///
/// # Safety
/// As for [`normalise_store`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tiers<const W: usize, const L: u32, const NV: usize>(
    care: bool,
    bits: u32,
    precise: bool,
    io: RowIo,
    gamma: *const u16,
    beta: *const u16,
    lane: usize,
    sum: impl Fn() -> f64,
    factors: impl FnOnce() -> Precise,
    st: Stats,
    eps: f32,
) {
    let hard = if care {
        // SAFETY: care is set only on active lanes; their outputs lie
        // inside the row.
        unsafe {
            let bits = if precise {
                expand_flags(bits)
            } else {
                care_bits::<W, L, NV>(io, gamma, beta, lane, st)
            };
            refine::<W, L>(bits, io, gamma, beta, lane, sum(), factors())
        }
    } else {
        0
    };
    if gpu::wave_any(hard != 0) {
        let sum = sum();
        // SAFETY: io.x read only where active; bits as above.
        unsafe {
            let c = exact_factor::<W, L, NV>(io.x, sum, st.rstd, eps, lane, io.active);
            exact::<W, L>(hard, io, gamma, beta, lane, sum, c);
        }
    }
}

crate::out_of_line! {
/// Tiers 2 and 3 of [`normalise_store`] for a row group whose wave holds a
/// flagged output (`care`, `bits`, `precise` as there), with the row's f64
/// sums formed again from the reloaded inputs (the same values in the
/// same order as [`super::ln_stats::lane_sums`] and the same group
/// reduction, so the same sums up to the sign of a zero sum) rather than
/// kept across the fast loop. Out of line on NVIDIA
/// ([`crate::out_of_line`]): in the 192-wide affine add+LayerNorm the
/// kept sums and the inline tiers cost the fast path 8 registers (40
/// instead of 32) and a quarter of its warps per SM; as a call, held to
/// 32 registers, the entry measured about 4.5% faster on the H200.
/// The LayerNorm entries were
/// slower this way at their bounds; they keep the inline tiers and park
/// their sums ([`Refine::Parked`]). Every lane of the wave must call it.
///
/// # Safety
/// As for [`normalise_store`] (`x`, `y`, `active` those of its `io`).
#[allow(clippy::too_many_arguments)]
unsafe fn refine_row<const W: usize, const L: u32, const NV: usize>(
    care: bool,
    bits: u32,
    precise: bool,
    x: *const u16,
    y: *mut u16,
    active: bool,
    gamma: *const u16,
    beta: *const u16,
    lane: usize,
    rstd: f32,
    eps: f32,
) {
    // Scalar arguments rather than a `RowIo`: an aggregate argument went
    // through the stack on NVIDIA, stored on the fast path.
    let io = RowIo { x, y, active };
    // Summed as loaded: the row as an array passed to `ln_stats::row_sums`
    // went to local memory here.
    let (mut sum, mut sq) = (0.0f64, 0.0f64);
    crate::unroll!(k in [0, 1, 2, 3] {
        if k < NV && active && in_row::<W, L, NV>(k, lane) {
            // SAFETY: the vector lies inside the row (caller contract).
            let v = unsafe { load8(x.add((k * L as usize + lane) * 8)) };
            for v in v {
                let v = f64::from(v);
                sum += v;
                sq = gpu::fma_f64(v, v, sq);
            }
        }
    });
    let [sum, sq] = group_sum_f64_n::<L, 2>([sum, sq]);
    let sums = RowSums { sum, sq };
    let st = Stats::of(rstd, mean_of::<W>(sum));
    let factors = || Precise::of::<W>(sums, rstd, eps);
    // SAFETY: caller contract.
    unsafe { tiers::<W, L, NV>(care, bits, precise, io, gamma, beta, lane, || sum, factors, st, eps) };
}
}

/// Whether vector step `k` of `lane` lies inside the row. Always true, and
/// known at compile time, when `L * NV` vectors cover the row exactly
/// ([`wavefuse_shared::RowLayout::for_width`]); the last step of a
/// [`wavefuse_shared::RowLayout::with_lanes`] row may leave some lanes out.
/// 32-bit arithmetic (one compare, where `usize` costs two on NVIDIA).
#[inline(always)]
pub fn in_row<const W: usize, const L: u32, const NV: usize>(k: usize, lane: usize) -> bool {
    L as usize * NV * 8 == W || (k as u32 * L + lane as u32) * 8 < W as u32
}

macro_rules! layer_norm_entries {
    ($($plain:ident, $affine:ident: W = $w:literal, L = $l:literal, NV = $nv:literal;)*) => {$(
        kernel! {
            /// LayerNorm without affine, fixed width.
            pub fn $plain(x: *const u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32) {
                // SAFETY: extents checked by the host API.
                unsafe { layer_norm::<$w, $l, $nv, false>(x, y, gamma, beta, rows, eps) }
            }
        }
        kernel! {
            /// LayerNorm with f16 gamma and beta, fixed width.
            pub fn $affine(x: *const u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32) {
                // SAFETY: extents checked by the host API.
                unsafe { layer_norm::<$w, $l, $nv, true>(x, y, gamma, beta, rows, eps) }
            }
        }
    )*};
}

// L and NV must equal wavefuse_shared::RowLayout::for_width(W); the
// `layouts_match_shared` test below keeps them in step.
layer_norm_entries! {
    wf_layer_norm_192, wf_layer_norm_affine_192: W = 192, L = 8, NV = 3;
    wf_layer_norm_384, wf_layer_norm_affine_384: W = 384, L = 16, NV = 3;
    wf_layer_norm_768, wf_layer_norm_affine_768: W = 768, L = 32, NV = 3;
}

#[cfg(test)]
mod tests {
    use wavefuse_shared::RowLayout;

    #[test]
    fn layouts_match_shared() {
        for (w, l, nv) in [(192, 8, 3), (384, 16, 3), (768, 32, 3)] {
            let s = RowLayout::for_width(w).expect("supported");
            assert_eq!((s.lanes, s.vecs_per_lane), (l, nv));
        }
    }
}
