//! Test data: deterministic random bytes and files, checksums, sizes.

use crate::process::run_ok;
use crate::rng::Rng;
use std::path::Path;
use std::process::Command;

/// `len` pseudo-random bytes from `seed` ([`Rng::bytes`]; the same seed
/// always gives the same bytes).
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    Rng::new(seed).bytes(len)
}

/// Writes [`random_bytes`]`(len, seed)` to `path`.
pub fn write_random_file(path: &Path, len: usize, seed: u64) {
    std::fs::write(path, random_bytes(len, seed))
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// sha256 of a file as lowercase hex (by `sha256sum`, so a peer tool and
/// not our code computes it).
pub fn sha256_file(path: &Path) -> String {
    let o = run_ok(Command::new("sha256sum").arg(path));
    let sum = o.stdout.split_whitespace().next().unwrap_or_default();
    assert_eq!(sum.len(), 64, "sha256sum printed {:?}", o.stdout);
    sum.to_string()
}

/// Parses `4096`, `64k`, `32M`, `1G`, `2T` (powers of 1024; either case).
/// Panics on anything else.
pub fn parse_size(s: &str) -> u64 {
    let s = s.trim();
    let (n, m) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        Some('t' | 'T') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    n.parse::<u64>()
        .unwrap_or_else(|_| panic!("not a size: {s:?}"))
        * m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_bytes_are_deterministic_and_seeded() {
        assert_eq!(random_bytes(1000, 7), random_bytes(1000, 7));
        assert_ne!(random_bytes(1000, 7), random_bytes(1000, 8));
        assert_eq!(random_bytes(13, 7)[..], random_bytes(1000, 7)[..13]);
        assert!(random_bytes(0, 1).is_empty());
        // Not mostly zeros: every byte value turns up in 64 KiB.
        let v = random_bytes(64 << 10, 2);
        let mut seen = [false; 256];
        v.iter().for_each(|&b| seen[b as usize] = true);
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn random_file_and_its_checksum() {
        let dir = std::env::temp_dir().join(format!("iolift-testkit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        write_random_file(&a, 4096, 1);
        write_random_file(&b, 4096, 1);
        assert_eq!(std::fs::read(&a).unwrap(), random_bytes(4096, 1));
        assert_eq!(sha256_file(&a), sha256_file(&b));
        write_random_file(&b, 4096, 2);
        assert_ne!(sha256_file(&a), sha256_file(&b));
        std::fs::write(&a, b"").unwrap();
        assert_eq!(
            sha256_file(&a),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), 4096);
        assert_eq!(parse_size("64k"), 64 << 10);
        assert_eq!(parse_size("32M"), 32 << 20);
        assert_eq!(parse_size("1g"), 1 << 30);
        assert_eq!(parse_size(" 2T "), 2 << 40);
        assert!(std::panic::catch_unwind(|| parse_size("12x")).is_err());
        assert!(std::panic::catch_unwind(|| parse_size("M")).is_err());
    }
}
