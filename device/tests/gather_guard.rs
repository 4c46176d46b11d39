//! The gather kernels never read outside the source, even for table entries
//! the host API would reject: anything outside `0..n_src` writes zeros.
//! (Launched directly in the emulator, bypassing the host's validation.)
use wavefuse_device::emu::{LaunchConfig, launch};
use wavefuse_device::kernels as k;

const W: usize = 192;

/// Out-of-range entries of every kind, then valid ones.
const TABLE: [i32; 7] = [i32::MAX, -1, -7, 2, 0, i32::MIN, 1];
const N_SRC: u64 = 2;

fn src() -> Vec<u16> {
    // Two tokens of 1.0 and 2.0 (f16 bits).
    let mut s = vec![0x3c00u16; W];
    s.extend(vec![0x4000u16; W]);
    s
}

fn cfg(wave: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (1, 1),
        block: 256,
        wave,
        shared_bytes: 0,
    }
}

fn expect(out: &[u16], ln: bool) {
    for (t, &i) in TABLE.iter().enumerate() {
        let row = &out[t * W..(t + 1) * W];
        let ok = match i {
            0 | 1 if !ln => row.iter().all(|&b| b == [0x3c00, 0x4000][i as usize]),
            // LayerNorm of a constant row is 0 (no affine).
            0 | 1 => row.iter().all(|&b| b == 0),
            _ => row.iter().all(|&b| b == 0),
        };
        assert!(ok, "token {t} (idx {i}): {:x?}", &row[..4]);
    }
}

#[repr(C, align(16))]
struct Aligned<const N: usize>([u16; N]);

#[test]
fn out_of_range_entries_write_zeros() {
    let s = src();
    let mut sbuf = Box::new(Aligned([0u16; 2 * W]));
    sbuf.0.copy_from_slice(&s);
    for wave in [32, 64] {
        for kernel in 0..3 {
            let mut out = Box::new(Aligned([0xffffu16; 7 * W]));
            let (sp, ip, op) = (
                sbuf.0.as_ptr() as usize,
                TABLE.as_ptr() as usize,
                out.0.as_mut_ptr() as usize,
            );
            launch(&cfg(wave), &|| {
                let (sp, ip, op) = (sp as *const u16, ip as *const i32, op as *mut u16);
                // SAFETY: buffers sized for 2 source and 7 output tokens of W.
                unsafe {
                    match kernel {
                        0 => k::wf_gather_192(sp, ip, op, 7, N_SRC),
                        1 => k::wf_gather_generic(sp, ip, op, 7, N_SRC, (W / 8) as u64),
                        _ => k::wf_layer_norm_gather_192(
                            sp,
                            ip,
                            op,
                            core::ptr::null(),
                            core::ptr::null(),
                            7,
                            N_SRC,
                            1e-5,
                        ),
                    }
                }
            })
            .expect("clean launch");
            expect(&out.0, kernel == 2);
        }
    }
}
