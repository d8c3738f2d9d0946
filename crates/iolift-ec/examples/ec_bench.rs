//! The bench of `iolift ec bench` without the iolift binary, for quick
//! runs while working on the kernels:
//! `cargo run --release -p iolift-ec --example ec_bench -- k=8 m=4
//! sizes=4096,1048576 threads=1 reps=5 ms=30 only=iolift,isal clock=cpu`.
//! (`bench/ec.sh` is the measurement of record.)

use iolift_ec::bench::{self, BenchOptions};

fn list(v: &str) -> Vec<usize> {
    v.split(',').map(|x| x.parse().expect("a number")).collect()
}

fn main() {
    let mut o = BenchOptions {
        km: Vec::new(),
        sizes: vec![4096, 65536, 1 << 20],
        threads: vec![1],
        reps: 5,
        ms: 30,
        only: Vec::new(),
        cpu_clock: false,
    };
    let (mut ks, mut m) = (vec![8], 4);
    for a in std::env::args().skip(1) {
        let (key, val) = a.split_once('=').expect("key=value");
        match key {
            "k" => ks = list(val),
            "m" => m = val.parse().expect("m"),
            "sizes" => o.sizes = list(val),
            "threads" => o.threads = list(val),
            "reps" => o.reps = val.parse().expect("reps"),
            "ms" => o.ms = val.parse().expect("ms"),
            "only" => o.only = val.split(',').map(String::from).collect(),
            "clock" => o.cpu_clock = val == "cpu",
            _ => panic!("unknown argument {key}"),
        }
    }
    o.km = ks.into_iter().map(|k| (k, m)).collect();
    bench::run(&o, &mut std::io::stdout()).expect("bench");
}
