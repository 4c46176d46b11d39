//! The matrix instructions of the emulator against the vendors' layouts,
//! and the `gpu::mma` facade against a plain matrix product, in both wave
//! modes: [`Warp32`] (NVIDIA's mma.m16n8k16 fragments) runs in wave32,
//! [`Wave64`] (AMD's MFMA 16x16x16 fragments) in wave64. Each layout test
//! has a twin that feeds a deliberately wrong layout and must see the
//! product come out wrong.
use half::f16;
use std::sync::Mutex;
use wavefuse_device::emu::{EmuError, LaunchConfig, MatrixOp, MatrixRegs, launch, run_matrix};
use wavefuse_device::gpu::mma::{MatrixKernel, Mma, Swizzle, Tile};
use wavefuse_device::gpu::{self, thread_id};

fn cfg(block: u32, wave: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (1, 1),
        block,
        wave,
        shared_bytes: 4096,
    }
}

/// Small integers and halves: every product and sum is exact in f32, so
/// the emulator's result must equal the f64 product exactly.
fn matrix(seed: u64, rows: usize, cols: usize) -> Vec<f16> {
    let mut s = seed;
    (0..rows * cols)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            f16::from_f32(((s >> 33) % 17) as f32 * 0.5 - 4.0)
        })
        .collect()
}

fn product(a: &[f16], b: &[f16], n: usize) -> Vec<f32> {
    product_kn(a, b, 16, n)
}

/// `A * B` for `A` 16 x `k`, `B` `k` x `n` (row-major), exact in f64 and
/// rounded once to f32.
fn product_kn(a: &[f16], b: &[f16], k: usize, n: usize) -> Vec<f32> {
    let mut d = vec![0.0f32; 16 * n];
    for i in 0..16 {
        for j in 0..n {
            d[i * n + j] = (0..k)
                .map(|x| a[i * k + x].to_f64() * b[x * n + j].to_f64())
                .sum::<f64>() as f32;
        }
    }
    d
}

/// Where PTX ISA's m16n8k16 fragment tables put each element, as the
/// forward map (element -> lane, register, half), independent of the
/// emulator's inverse form: A `(r, c)`: lane `4 (r % 8) + (c % 8) / 2`,
/// register `r / 8 + 2 (c / 8)`, half `c % 2`; B `(k, n)`: lane
/// `4 n + (k % 8) / 2`, register `k / 8`, half `k % 2`; C `(r, n)`: lane
/// `4 (r % 8) + n / 2`, register `2 (r / 8) + n % 2`.
fn nv_fragments(a: &[f16], b: &[f16]) -> Vec<MatrixRegs> {
    let mut regs = vec![MatrixRegs::default(); 32];
    for r in 0..16 {
        for c in 0..16 {
            let (lane, reg, h) = (4 * (r % 8) + (c % 8) / 2, r / 8 + 2 * (c / 8), c % 2);
            regs[lane].a[reg] |= u32::from(a[r * 16 + c].to_bits()) << (16 * h);
        }
    }
    for k in 0..16 {
        for n in 0..8 {
            let (lane, reg, h) = (4 * n + (k % 8) / 2, k / 8, k % 2);
            regs[lane].b[reg] |= u32::from(b[k * 8 + n].to_bits()) << (16 * h);
        }
    }
    regs
}

fn nv_result(regs: &[MatrixRegs]) -> Vec<f32> {
    let mut d = vec![0.0f32; 128];
    for r in 0..16 {
        for n in 0..8 {
            d[r * 8 + n] = regs[4 * (r % 8) + n / 2].c[2 * (r / 8) + n % 2];
        }
    }
    d
}

/// AMD's calculator for v_mfma_f32_16x16x16f16, forward: A `(i, k)` in
/// lane `i + 16 (k / 4)`, item `k % 4`; B `(k, j)` in lane
/// `j + 16 (k / 4)`, item `k % 4`; D `(i, j)` in lane `j + 16 (i / 4)`,
/// register `i % 4`.
fn amd_fragments(a: &[f16], b: &[f16]) -> Vec<MatrixRegs> {
    let mut regs = vec![MatrixRegs::default(); 64];
    for i in 0..16 {
        for k in 0..16 {
            let (lane, item) = (i + 16 * (k / 4), k % 4);
            regs[lane].a[item / 2] |= u32::from(a[i * 16 + k].to_bits()) << (16 * (item % 2));
            let (lane, item) = (i + 16 * (k / 4), k % 4); // B(k, j = i)
            regs[lane].b[item / 2] |= u32::from(b[k * 16 + i].to_bits()) << (16 * (item % 2));
        }
    }
    regs
}

fn amd_result(regs: &[MatrixRegs]) -> Vec<f32> {
    let mut d = vec![0.0f32; 256];
    for i in 0..16 {
        for j in 0..16 {
            d[i * 16 + j] = regs[j + 16 * (i / 4)].c[i % 4];
        }
    }
    d
}

/// Runs one matrix instruction with the given per-lane registers.
fn run_instruction(op: MatrixOp, regs: Vec<MatrixRegs>) -> Result<Vec<MatrixRegs>, EmuError> {
    let lanes = op.lanes();
    let slots = Mutex::new(regs);
    launch(&cfg(lanes, lanes), &|| {
        let l = thread_id() as usize;
        let mut r = slots.lock().map(|s| s[l]).unwrap_or_default();
        run_matrix(op, &mut r);
        if let Ok(mut s) = slots.lock() {
            s[l] = r;
        }
    })?;
    Ok(slots.into_inner().unwrap_or_default())
}

#[test]
fn nv_mma_matches_the_ptx_fragment_tables() {
    let (a, b) = (matrix(1, 16, 16), matrix(2, 16, 8));
    let got =
        nv_result(&run_instruction(MatrixOp::Mma16816, nv_fragments(&a, &b)).expect("launch"));
    assert_eq!(got, product(&a, &b, 8));
}

#[test]
fn nv_mma_with_a_wrong_layout_is_wrong() {
    // Swapping a1 and a2 (rows g + 8 and columns 8.. exchanged) is the
    // classic fragment mistake; the product must show it.
    let (a, b) = (matrix(3, 16, 16), matrix(4, 16, 8));
    let mut regs = nv_fragments(&a, &b);
    for r in regs.iter_mut() {
        r.a.swap(1, 2);
    }
    let got = nv_result(&run_instruction(MatrixOp::Mma16816, regs).expect("launch"));
    assert_ne!(got, product(&a, &b, 8));
}

/// PTX ISA's m16n8k8 fragments (`.f16`), forward: A `(r, c)` (16x8):
/// lane `4 (r % 8) + c / 2`, register `r / 8`, half `c % 2`; B `(k, n)`
/// (8x8): lane `4 n + k / 2`, register 0, half `k % 2`; C as m16n8k16's.
fn nv8_fragments(a: &[f16], b: &[f16]) -> Vec<MatrixRegs> {
    let mut regs = vec![MatrixRegs::default(); 32];
    for r in 0..16 {
        for c in 0..8 {
            let (lane, reg, h) = (4 * (r % 8) + c / 2, r / 8, c % 2);
            regs[lane].a[reg] |= u32::from(a[r * 8 + c].to_bits()) << (16 * h);
        }
    }
    for k in 0..8 {
        for n in 0..8 {
            let (lane, h) = (4 * n + k / 2, k % 2);
            regs[lane].b[0] |= u32::from(b[k * 8 + n].to_bits()) << (16 * h);
        }
    }
    regs
}

#[test]
fn nv_mma_k8_matches_the_ptx_fragment_tables() {
    let (a, b) = (matrix(21, 16, 8), matrix(22, 8, 8));
    let got =
        nv_result(&run_instruction(MatrixOp::Mma1688, nv8_fragments(&a, &b)).expect("launch"));
    assert_eq!(got, product_kn(&a, &b, 8, 8));
}

#[test]
fn nv_mma_k8_with_a_wrong_layout_is_wrong() {
    // Rows g and g + 8 of A exchanged.
    let (a, b) = (matrix(23, 16, 8), matrix(24, 8, 8));
    let mut regs = nv8_fragments(&a, &b);
    for r in regs.iter_mut() {
        r.a.swap(0, 1);
    }
    let got = nv_result(&run_instruction(MatrixOp::Mma1688, regs).expect("launch"));
    assert_ne!(got, product_kn(&a, &b, 8, 8));
}

#[test]
fn nv_mma_accumulates_into_c() {
    let (a, b) = (matrix(5, 16, 16), matrix(6, 16, 8));
    let mut regs = nv_fragments(&a, &b);
    for (l, r) in regs.iter_mut().enumerate() {
        r.c = [l as f32, 0.5, -1.0, 2.0];
    }
    let c_in: Vec<MatrixRegs> = regs.clone();
    let got = nv_result(&run_instruction(MatrixOp::Mma16816, regs).expect("launch"));
    let want = product(&a, &b, 8);
    let c = nv_result(&c_in);
    for i in 0..128 {
        assert_eq!(got[i], want[i] + c[i], "element {i}");
    }
}

#[test]
fn amd_mfma_matches_the_calculator_tables() {
    let (a, b) = (matrix(7, 16, 16), matrix(8, 16, 16));
    let got = amd_result(
        &run_instruction(MatrixOp::Mfma16x16x16, amd_fragments(&a, &b)).expect("launch"),
    );
    assert_eq!(got, product(&a, &b, 16));
}

#[test]
fn amd_mfma_with_a_wrong_layout_is_wrong() {
    // Reading D as if a lane held a row (the A layout) instead of a column.
    let (a, b) = (matrix(9, 16, 16), matrix(10, 16, 16));
    let regs = run_instruction(MatrixOp::Mfma16x16x16, amd_fragments(&a, &b)).expect("launch");
    let mut wrong = vec![0.0f32; 256];
    for i in 0..16 {
        for j in 0..16 {
            wrong[i * 16 + j] = regs[i + 16 * (j / 4)].c[j % 4];
        }
    }
    assert_ne!(wrong, product(&a, &b, 16));
    // And B given in A's layout (k along the lane's items of a row).
    let mut regs = amd_fragments(&a, &b);
    for i in 0..16 {
        for k in 0..16 {
            let (lane, item) = (i + 16 * (k / 4), k % 4);
            let w = &mut regs[lane].b[item / 2];
            *w &= !(0xffff << (16 * (item % 2)));
            *w |= u32::from(b[i * 16 + k].to_bits()) << (16 * (item % 2));
        }
    }
    let got = amd_result(&run_instruction(MatrixOp::Mfma16x16x16, regs).expect("launch"));
    assert_ne!(got, product(&a, &b, 16));
}

#[test]
fn matrix_instructions_need_their_wave_size_and_the_whole_wave() {
    let e = launch(&cfg(64, 64), &|| {
        let mut r = MatrixRegs::default();
        run_matrix(MatrixOp::Mma16816, &mut r);
    });
    assert!(matches!(e, Err(EmuError::MatrixWave { .. })), "{e:?}");
    let e = launch(&cfg(32, 32), &|| {
        let mut r = MatrixRegs::default();
        run_matrix(MatrixOp::Mfma16x16x16, &mut r);
    });
    assert!(matches!(e, Err(EmuError::MatrixWave { .. })), "{e:?}");
    let e = launch(&cfg(64, 32), &|| {
        if thread_id() == 40 {
            return;
        }
        let mut r = MatrixRegs::default();
        run_matrix(MatrixOp::Mma16816, &mut r);
    });
    assert!(
        matches!(
            e,
            Err(EmuError::PartialCollective {
                wave: 1,
                exited: 1,
                ..
            })
        ),
        "{e:?}"
    );
    let e = launch(&cfg(64, 64), &|| {
        let mut r = MatrixRegs::default();
        if thread_id() < 3 {
            gpu::shfl_xor_u32(0, 1);
        } else {
            run_matrix(MatrixOp::Mfma16x16x16, &mut r);
        }
    });
    assert!(
        matches!(e, Err(EmuError::DivergentCollective { .. })),
        "{e:?}"
    );
}

// ---- the facade: loads from workgroup memory, mma, coordinates ----

/// Tile row stride in workgroup memory (halves): 4 chunks, so every
/// swizzle keeps a chunk in its row. The operands are the 16x16 parts at
/// column 16 of rows 0, 16 and 32 (the swizzle's XOR then crosses the
/// part's first column, as the kernel's second key half does).
const S: usize = 32;
/// Column of the operands' parts.
const C0: usize = 16;

/// Where element `(r, c)` of the test's tile lies under swizzle `sw`, by
/// the layout `Swizzle`'s docs state (written out here, not the facade's
/// `Tile::at`).
fn swizzled(sw: Swizzle, r: usize, c: usize) -> usize {
    let x = if sw == Swizzle::PAIRS {
        (r >> 2) & 1
    } else if sw == Swizzle::QUADS {
        (r >> 1) & 3
    } else {
        0
    };
    r * S + 8 * ((c / 8) ^ x) + c % 8
}

/// How the facade test forms its product.
#[derive(Clone, Copy)]
enum Form {
    /// `A * B` with `B` row-major (`load_b`).
    Nn,
    /// `A * B` with `B` given by columns (`load_b_t` of `B^T`).
    Nt,
    /// `to_a(A * I) * B`: the accumulator reused as a left operand.
    Reuse,
    /// `A * B` in quad order (`load_b_t_quads` of `B^T`).
    QuadsNt,
    /// `to_a(A * I) * B` with `A * I` in quad order (`load_b_t_quads` of
    /// `I`) and `B` read to match it (`load_b_quads`).
    QuadsReuse,
    /// `A * B + 2.5 A`: `add_scaled(A, diag(2.5), A * B)` (`load_b`).
    Scaled,
    /// `A' * B` with `A'` built by `a_of` from `A`'s elements.
    AOf,
    /// `0.5 + A[.., 0..8] * B[0..8, ..]`: `mma8` of `a8_of` and
    /// `load_b8_t` (of `B^T`) onto `splat(0.5)`.
    K8,
}

struct Facade {
    a: usize,
    b: usize,
    out: usize,
    form: Form,
    sw: Swizzle,
}

/// Element `(i, k)` of the facade test's `A` (16x16 row-major).
fn self_a(f: &Facade, i: u32, k: u32) -> &f16 {
    // SAFETY: a 16x16 input; i, k < 16.
    unsafe { &*(f.a as *const f16).add(i as usize * 16 + k as usize) }
}

impl MatrixKernel for Facade {
    fn run<M: Mma>(self) {
        let (a, b) = (self.a as *const f16, self.b as *const f16);
        let out = self.out as *mut f32;
        let m = gpu::workgroup_mem::<u16>();
        let t = thread_id() as usize;
        if t == 0 {
            for i in 0..16 {
                for k in 0..16 {
                    // SAFETY: 16x16 inputs; 48 rows of S halves fit in
                    // the 4096-byte workgroup memory.
                    unsafe {
                        let at = |r: usize| m.add(swizzled(self.sw, r, C0 + k));
                        at(i).write((*a.add(i * 16 + k)).to_bits());
                        let bt = match self.form {
                            Form::Nt | Form::QuadsNt | Form::K8 => *b.add(k * 16 + i),
                            _ => *b.add(i * 16 + k),
                        };
                        at(16 + i).write(bt.to_bits());
                        let id = if i == k { f16::ONE } else { f16::ZERO };
                        at(32 + i).write(id.to_bits());
                    }
                }
            }
        }
        gpu::barrier();
        let t = Tile::new(m, S, self.sw);
        // The quad-order loads take an unswizzled tile (the part's origin).
        let q = |r: usize| m.wrapping_add(r * S + C0).cast_const();
        // SAFETY: the tiles above, 16-byte aligned rows (S = 32 halves).
        let acc = unsafe {
            let a = M::load_a(t, 0, C0);
            match self.form {
                Form::Nn => M::mma(a, M::load_b(t, 16, C0), M::zero()),
                Form::Nt => M::mma(a, M::load_b_t(t, 16, C0), M::zero()),
                Form::Reuse => {
                    let c = M::mma(a, M::load_b(t, 32, C0), M::zero());
                    M::mma(M::to_a(c), M::load_b(t, 16, C0), M::zero())
                }
                Form::QuadsNt => M::mma(a, M::load_b_t_quads(q(16), S), M::zero()),
                Form::QuadsReuse => {
                    let c = M::mma(a, M::load_b_t_quads(q(32), S), M::zero());
                    M::mma(M::to_a(c), M::load_b_quads(q(16), S), M::zero())
                }
                Form::Scaled => {
                    let c = M::mma(a, M::load_b(t, 16, C0), M::zero());
                    M::add_scaled(a, M::diag(f16::from_f32(2.5).to_bits()), c)
                }
                Form::AOf => {
                    let af = M::a_of(|i, k| self_a(&self, i, k).to_bits());
                    M::mma(af, M::load_b(t, 16, C0), M::zero())
                }
                Form::K8 => {
                    assert!(M::LANES == 32 || M::LANES == 64);
                    let a8 = M::a8_of(|i, k| {
                        assert!(k < 8, "a8_of asked for k = {k}");
                        self_a(&self, i, k).to_bits()
                    });
                    M::mma8(a8, M::load_b8_t(t, 16, C0), M::splat(0.5))
                }
            }
        };
        let quads = matches!(self.form, Form::QuadsNt);
        assert_eq!(M::quad_col() % 4, 0);
        for e in 0..M::ACC_LEN {
            let i = M::acc_row(e);
            let j = if quads {
                M::quad_col() + M::quad_pos(e) as u32
            } else {
                M::acc_col(e)
            };
            if quads && e % 2 == 1 {
                assert_eq!(M::quad_pos(e), M::quad_pos(e - 1) + 1, "pairs are adjacent");
            }
            assert_eq!(i, M::slot_row(M::acc_slot(e)));
            if e % 2 == 1 && !quads {
                assert_eq!(j, M::acc_col(e - 1) + 1, "pairs are adjacent columns");
            }
            // SAFETY: a 16x16 output; each element written by one lane.
            unsafe { out.add(i as usize * 16 + j as usize).write(acc.as_ref()[e]) };
        }
    }
}

fn facade_product(wave: u32, form: Form, sw: Swizzle, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let (a, b) = (matrix(seed, 16, 16), matrix(seed + 1, 16, 16));
    let want = match form {
        Form::Scaled => product(&a, &b, 16)
            .iter()
            .zip(&a)
            .map(|(p, x)| p + 2.5 * x.to_f32())
            .collect(),
        Form::K8 => {
            let (a8, b8): (Vec<f16>, Vec<f16>) = (
                (0..16 * 8).map(|x| a[(x / 8) * 16 + x % 8]).collect(),
                b[..8 * 16].to_vec(),
            );
            product_kn(&a8, &b8, 8, 16)
                .iter()
                .map(|p| p + 0.5)
                .collect()
        }
        _ => product(&a, &b, 16),
    };
    let mut out = vec![f32::NAN; 256];
    let (pa, pb, po) = (
        a.as_ptr() as usize,
        b.as_ptr() as usize,
        out.as_mut_ptr() as usize,
    );
    launch(&cfg(wave, wave), &|| {
        gpu::mma::run(Facade {
            a: pa,
            b: pb,
            out: po,
            form,
            sw,
        })
    })
    .expect("launch");
    (out, want)
}

#[test]
fn facade_products_match_in_both_wave_modes() {
    for wave in [32, 64] {
        for (form, name) in [
            (Form::Nn, "nn"),
            (Form::Nt, "nt"),
            (Form::Reuse, "reuse"),
            (Form::QuadsNt, "quads nt"),
            (Form::QuadsReuse, "quads reuse"),
            (Form::Scaled, "scaled"),
            (Form::AOf, "a_of"),
            (Form::K8, "k8"),
        ] {
            // The quad-order loads read unswizzled tiles only.
            let quads = matches!(form, Form::QuadsNt | Form::QuadsReuse);
            for sw in [Swizzle::NONE, Swizzle::PAIRS, Swizzle::QUADS] {
                if quads && sw != Swizzle::NONE {
                    continue;
                }
                for seed in [11, 12, 13] {
                    let (got, want) = facade_product(wave, form, sw, seed);
                    assert_eq!(got, want, "wave{wave} {name} {sw:?} seed {seed}");
                }
            }
        }
    }
}

/// Row reductions: every lane of a row gets the row's max and sum.
struct Rows {
    out: usize,
}

impl MatrixKernel for Rows {
    fn run<M: Mma>(self) {
        let out = self.out as *mut f32;
        let mut acc = M::zero();
        for e in 0..M::ACC_LEN {
            let (i, j) = (M::acc_row(e), M::acc_col(e));
            acc.as_mut()[e] = (i * 16 + (j * 7) % 16) as f32;
        }
        let mut mx = [f32::NEG_INFINITY; 2];
        let mut sm = [0.0f32; 2];
        for e in 0..M::ACC_LEN {
            let r = M::acc_slot(e);
            mx[r] = mx[r].max(acc.as_ref()[e]);
            sm[r] += acc.as_ref()[e];
        }
        for r in 0..M::ROWS {
            let (m, s) = (M::row_max(mx[r]), M::row_sum(sm[r]));
            let i = M::slot_row(r) as usize;
            let lane = (thread_id() % M::LANES) as usize;
            // SAFETY: 16 rows x 64 lanes x 2 values.
            unsafe {
                out.add((i * 64 + lane) * 2).write(m);
                out.add((i * 64 + lane) * 2 + 1).write(s);
            }
        }
    }
}

#[test]
fn row_reductions_cover_each_row_once() {
    for wave in [32u32, 64] {
        let mut out = vec![f32::NAN; 16 * 64 * 2];
        let po = out.as_mut_ptr() as usize;
        launch(&cfg(wave, wave), &|| gpu::mma::run(Rows { out: po })).expect("launch");
        for i in 0..16 {
            let want_max = (i * 16 + 15) as f32;
            let want_sum = (0..16).map(|j| (i * 16 + j) as f32).sum::<f32>();
            let mut lanes = 0;
            for l in 0..wave as usize {
                let (m, s) = (out[(i * 64 + l) * 2], out[(i * 64 + l) * 2 + 1]);
                if m.is_nan() {
                    continue;
                }
                lanes += 1;
                assert_eq!((m, s), (want_max, want_sum), "wave{wave} row {i} lane {l}");
            }
            // A quad on NVIDIA, lanes i + 16q on AMD.
            assert_eq!(lanes, 4, "wave{wave} row {i}: lanes holding it");
        }
    }
}

/// Row sums on the matrix unit: two 16x16 tiles (one 16x32 row-major
/// matrix) summed per row by `add_row_sums`, read back by `row_sums` on
/// every lane that holds the row.
struct RowSums {
    a: usize,
    out: usize,
}

impl MatrixKernel for RowSums {
    fn run<M: Mma>(self) {
        let (a, out) = (self.a as *const f16, self.out as *mut f32);
        let m = gpu::workgroup_mem::<u16>();
        if thread_id() == 0 {
            for x in 0..16 * 32 {
                // SAFETY: 16 rows of S = 32 halves fit the workgroup memory.
                unsafe { m.add(x).write((*a.add(x)).to_bits()) };
            }
        }
        gpu::barrier();
        let t = Tile::new(m, S, Swizzle::NONE);
        // SAFETY: rows 0..16, columns 0..32 of the tile above.
        let s = unsafe {
            M::add_row_sums(
                M::load_a(t, 0, 16),
                M::add_row_sums(M::load_a(t, 0, 0), M::sums_zero()),
            )
        };
        let sums = M::row_sums(s);
        let lane = (thread_id() % M::LANES) as usize;
        for (r, sum) in sums.iter().enumerate().take(M::ROWS) {
            let i = M::slot_row(r) as usize;
            // SAFETY: 16 rows x 64 lanes.
            unsafe { out.add(i * 64 + lane).write(*sum) };
        }
    }
}

#[test]
fn row_sums_on_the_matrix_unit_cover_each_row() {
    for wave in [32u32, 64] {
        for seed in [21, 22] {
            let a = matrix(seed, 16, 32);
            let mut out = vec![f32::NAN; 16 * 64];
            let (pa, po) = (a.as_ptr() as usize, out.as_mut_ptr() as usize);
            launch(&cfg(wave, wave), &|| {
                gpu::mma::run(RowSums { a: pa, out: po })
            })
            .expect("launch");
            for i in 0..16 {
                // Exact in f32 (halves of small integers).
                let want: f32 = a[i * 32..(i + 1) * 32].iter().map(|x| x.to_f32()).sum();
                let got: Vec<f32> = out[i * 64..(i + 1) * 64]
                    .iter()
                    .copied()
                    .filter(|x| !x.is_nan())
                    .collect();
                assert_eq!(got, vec![want; 4], "wave{wave} seed {seed} row {i}");
            }
        }
    }
}

#[test]
fn facade_with_a_wrong_layout_is_wrong() {
    // The NVIDIA fragments through the AMD instruction (and the reverse)
    // cannot run: the emulator rejects the wave size. Within one layout, a
    // right operand read as the left one gives a different product.
    struct Swapped {
        out: usize,
        a: usize,
        b: usize,
    }
    impl MatrixKernel for Swapped {
        fn run<M: Mma>(self) {
            let m = gpu::workgroup_mem::<u16>();
            let (a, b) = (self.a as *const f16, self.b as *const f16);
            if thread_id() == 0 {
                for x in 0..256 {
                    // SAFETY: two 16x16 tiles at stride S fit.
                    unsafe {
                        m.add((x / 16) * S + x % 16).write((*a.add(x)).to_bits());
                        m.add(16 * S + (x / 16) * S + x % 16)
                            .write((*b.add(x)).to_bits());
                    }
                }
            }
            gpu::barrier();
            // SAFETY: as above. `load_b_t` where `load_b` belongs.
            let t = Tile::new(m, S, Swizzle::NONE);
            let acc = unsafe { M::mma(M::load_a(t, 0, 0), M::load_b_t(t, 16, 0), M::zero()) };
            for e in 0..M::ACC_LEN {
                let (i, j) = (M::acc_row(e) as usize, M::acc_col(e) as usize);
                // SAFETY: 16x16 output.
                unsafe {
                    (self.out as *mut f32)
                        .add(i * 16 + j)
                        .write(acc.as_ref()[e])
                };
            }
        }
    }
    for wave in [32u32, 64] {
        let (a, b) = (matrix(21, 16, 16), matrix(22, 16, 16));
        let mut out = vec![f32::NAN; 256];
        let (pa, pb, po) = (
            a.as_ptr() as usize,
            b.as_ptr() as usize,
            out.as_mut_ptr() as usize,
        );
        launch(&cfg(wave, wave), &|| {
            gpu::mma::run(Swapped {
                out: po,
                a: pa,
                b: pb,
            })
        })
        .expect("launch");
        assert!(
            out.iter().all(|v| !v.is_nan()),
            "wave{wave}: every element written"
        );
        assert_ne!(out, product(&a, &b, 16), "wave{wave}");
    }
}

/// `Tile::at` places each row's chunks by the documented swizzle (a
/// permutation of the row's chunks), and the same for every 8-row step.
#[test]
fn tile_addresses_follow_the_swizzle() {
    let base = 0x1000 as *const u16;
    for sw in [Swizzle::NONE, Swizzle::PAIRS, Swizzle::QUADS] {
        let t = Tile::new(base, S, sw);
        for r in 0..48 {
            let mut seen = [false; S];
            for c in 0..S {
                let at = (t.at(r, c) as usize - base as usize) / 2;
                assert_eq!(at, swizzled(sw, r, c), "{sw:?} ({r}, {c})");
                seen[at - r * S] = true;
            }
            assert!(seen.iter().all(|&x| x), "{sw:?} row {r} is a permutation");
            assert_eq!(sw.of(r as u32), sw.of((r % 8) as u32), "{sw:?} row {r}");
        }
    }
}
