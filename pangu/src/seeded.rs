//! The seeded generator the Rust model and the PyTorch reference share
//! (`MODEL.md`): one tensor is a pure function of its name, its length and
//! the seed, so both sides make the same weights bit for bit and no weight
//! file needs to be stored.

/// FNV-1a, 64 bit.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// SplitMix64's output function of state `z` (the state advanced once).
pub fn splitmix64(z: u64) -> u64 {
    let mut z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Element `i` of tensor `name`: uniform in `[-1, 1)` on a 2^-23 grid.
pub fn unit(key: u64, i: u64) -> f64 {
    let u = splitmix64(key.wrapping_add(i));
    (u >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0
}

/// The key of tensor `name` under `seed`.
pub fn key(name: &str, seed: u64) -> u64 {
    fnv1a64(name.as_bytes()) ^ seed
}

/// `n` values `f32(center + scale * unit)` of tensor `name`.
pub fn uniform(name: &str, seed: u64, n: usize, center: f64, scale: f64) -> Vec<f32> {
    let k = key(name, seed);
    (0..n as u64)
        .map(|i| (center + scale * unit(k, i)) as f32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // FNV-1a's published value for "abc" and SplitMix64's first output
        // from state 0.
        assert_eq!(fnv1a64(b"abc"), 0xe71f_a219_0541_574b);
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
        let v = uniform("patch_embed.conv.bias", 1, 4, 0.0, 0.02);
        assert!(v.iter().all(|x| x.abs() <= 0.02));
        // Distinct names give distinct streams.
        assert_ne!(v, uniform("patch_embed.conv_surface.bias", 1, 4, 0.0, 0.02));
    }
}
