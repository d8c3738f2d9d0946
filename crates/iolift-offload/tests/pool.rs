//! Devices and the I/O pool on the CPU device (no GPU needed): completions
//! by future, blocking wait and callback; batching by size and by time;
//! several processing elements; whole-pool mapping vs per-PG placement;
//! asking for the GPU without one is a clear error.

use iolift_crush::{do_rule, Workspace};
use iolift_offload::kernels::crush::bench::random_inputs;
use iolift_offload::kernels::crush::synth::straw2_map;
use iolift_offload::kernels::crush::{self, CrushKernel};
use iolift_offload::{device, Device, Inputs, IoPool, MapHandle, OffloadError, PoolConfig};
use iolift_osdmap::placement::{map_object, pg_to_pps, Pool};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

fn setup(osds: usize) -> (Arc<dyn Device>, Arc<MapHandle>, Vec<u32>) {
    let dev = device::cpu(2).unwrap();
    let h = MapHandle::new(straw2_map(osds, 8, 4), None).unwrap();
    (dev, h, vec![0x10000; osds])
}

fn expect(h: &MapHandle, rule: i32, x: i32, rm: usize, w: &[u32]) -> Vec<i32> {
    let mut ws = Workspace::new(&h.map, rm);
    let mut row = vec![0; rm];
    let n = do_rule(&h.map, rule, x, &mut row, w, &mut ws, None);
    row.truncate(n);
    row
}

struct ThreadWaker(std::thread::Thread);
impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let w = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&w);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
}

#[test]
fn completions_by_wait_future_and_callback() {
    let (dev, h, w) = setup(120);
    let pool = IoPool::new(
        dev,
        CrushKernel::new(h.clone(), 0, 3, w.clone()).unwrap(),
        PoolConfig::default(),
    )
    .unwrap();
    for x in [0, 1, 77, -5, i32::MAX] {
        assert_eq!(pool.submit(x).wait().unwrap(), expect(&h, 0, x, 3, &w));
        assert_eq!(block_on(pool.submit(x)).unwrap(), expect(&h, 0, x, 3, &w));
    }
    let (tx, rx) = mpsc::channel();
    for x in 0..50 {
        let tx = tx.clone();
        pool.submit_with(x, move |r| tx.send((x, r)).unwrap());
    }
    let mut got = 0;
    for _ in 0..50 {
        let (x, r) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("callback ran");
        assert_eq!(r.unwrap(), expect(&h, 0, x, 3, &w));
        got += 1;
    }
    assert_eq!(got, 50);
    let xs = random_inputs(1000, 9);
    let cs = pool.submit_batch(&xs);
    for (c, &x) in cs.into_iter().zip(&xs) {
        assert_eq!(c.wait().unwrap(), expect(&h, 0, x, 3, &w));
    }
    pool.shutdown();
}

/// A group comes back as one `Mapping` in input order, split into chunks
/// of `max_batch` inputs (one launch each here); single tasks submitted in
/// between are unaffected; an empty group completes at once.
#[test]
fn groups_complete_once_with_every_row_in_order() {
    let (dev, h, w) = setup(120);
    let cfg = PoolConfig {
        max_batch: 64,
        max_wait: Duration::from_millis(200),
        pes: 2,
    };
    let pool = IoPool::new(
        dev,
        CrushKernel::new(h.clone(), 0, 3, w.clone()).unwrap(),
        cfg,
    )
    .unwrap();
    let xs = random_inputs(1000, 3);
    let g = pool.submit_group(xs.clone());
    let one = pool.submit(12345);
    let g2 = pool.submit_group(vec![7, 8, 9]);
    let m = g.wait().unwrap();
    assert_eq!(m.len(), 1000);
    assert_eq!(m.result_max, 3);
    for (i, &x) in xs.iter().enumerate() {
        assert_eq!(
            m.row(i),
            expect(&h, 0, x, 3, &w).as_slice(),
            "row {i} (x {x})"
        );
    }
    assert_eq!(one.wait().unwrap(), expect(&h, 0, 12345, 3, &w));
    let m2 = block_on(g2).unwrap();
    for (i, x) in [7, 8, 9].into_iter().enumerate() {
        assert_eq!(m2.row(i), expect(&h, 0, x, 3, &w).as_slice());
    }
    let e = pool.submit_group(Vec::new()).wait().unwrap();
    assert!(e.is_empty());
    let st = pool.stats();
    assert_eq!(st.tasks.load(Ordering::Relaxed), 1004);
    // 15 full chunks of 64, then 40 + 1 + 3 (together, unless a wait of
    // max_wait ran out in between): never more than 64 inputs per launch
    assert_eq!(st.largest_launch.load(Ordering::Relaxed), 64);
    let l = st.launches.load(Ordering::Relaxed);
    assert!((16..=18).contains(&l), "{l} launches");
    pool.shutdown();
}

#[test]
fn batching_by_size() {
    let (dev, h, w) = setup(60);
    // a long wait: only the size limit launches
    let cfg = PoolConfig {
        max_batch: 16,
        max_wait: Duration::from_secs(5),
        pes: 2,
    };
    let pool = IoPool::new(
        dev,
        CrushKernel::new(h.clone(), 1, 4, w.clone()).unwrap(),
        cfg,
    )
    .unwrap();
    let xs: Vec<i32> = (0..64).collect();
    let cs = pool.submit_batch(&xs);
    for (c, &x) in cs.into_iter().zip(&xs) {
        assert_eq!(c.wait().unwrap(), expect(&h, 1, x, 4, &w));
    }
    let st = pool.stats();
    assert_eq!(st.tasks.load(Ordering::Relaxed), 64);
    assert_eq!(st.launches.load(Ordering::Relaxed), 4);
    assert_eq!(st.largest_launch.load(Ordering::Relaxed), 16);
}

#[test]
fn batching_by_time() {
    let (dev, h, w) = setup(60);
    let cfg = PoolConfig {
        max_batch: 1_000_000,
        max_wait: Duration::from_millis(200),
        pes: 1,
    };
    let pool = IoPool::new(
        dev,
        CrushKernel::new(h.clone(), 0, 3, w.clone()).unwrap(),
        cfg,
    )
    .unwrap();
    let t = std::time::Instant::now();
    let cs = pool.submit_batch(&[1, 2, 3, 4, 5]);
    for c in cs {
        c.wait().unwrap();
    }
    // far below the size limit: the batch went when its time was up, as one launch
    assert!(
        t.elapsed() >= Duration::from_millis(150),
        "launched before max_wait"
    );
    assert_eq!(pool.stats().launches.load(Ordering::Relaxed), 1);
    assert_eq!(pool.stats().largest_launch.load(Ordering::Relaxed), 5);
}

#[test]
fn many_submitters_many_pes() {
    let (dev, h, w) = setup(200);
    let cfg = PoolConfig {
        max_batch: 64,
        max_wait: Duration::from_micros(50),
        pes: 4,
    };
    let pool = Arc::new(
        IoPool::new(
            dev,
            CrushKernel::new(h.clone(), 0, 3, w.clone()).unwrap(),
            cfg,
        )
        .unwrap(),
    );
    let mut ths = Vec::new();
    for t in 0..4 {
        let (pool, h, w) = (pool.clone(), h.clone(), w.clone());
        ths.push(std::thread::spawn(move || {
            for x in random_inputs(300, t) {
                assert_eq!(pool.submit(x).wait().unwrap(), expect(&h, 0, x, 3, &w));
            }
        }));
    }
    for t in ths {
        t.join().unwrap();
    }
    assert_eq!(pool.stats().tasks.load(Ordering::Relaxed), 1200);
}

#[test]
fn bad_arguments_are_errors() {
    let (dev, h, w) = setup(30);
    assert!(matches!(
        CrushKernel::new(h.clone(), 9, 3, w.clone()),
        Err(OffloadError::Invalid(_))
    ));
    assert!(matches!(
        CrushKernel::new(h.clone(), 0, 1 << 17, w.clone()),
        Err(OffloadError::Invalid(_))
    ));
    let cfg = PoolConfig {
        max_batch: 0,
        ..PoolConfig::default()
    };
    let k = CrushKernel::new(h.clone(), 0, 3, w.clone()).unwrap();
    assert!(IoPool::new(dev.clone(), k, cfg).is_err());
    assert!(crush::map(&*dev, &h, 5, Inputs::Xs(&[1]), 3, &w).is_err());
    let p = Pool {
        id: 1,
        pg_num: 0,
        pgp_num: 0,
        hashpspool: true,
    };
    assert!(crush::map_pool(&*dev, &h, &p, 0, 3, &w).is_err());
    assert!(matches!(
        device::open("fpga", 1),
        Err(OffloadError::Invalid(_))
    ));
    assert!(device::open("cpu:x", 1).is_err());
}

/// Without a CUDA driver, asking for the GPU is an error naming the cause
/// (never a panic). With one, it opens.
#[test]
fn gpu_request_without_gpu_is_a_clear_error() {
    match device::open("gpu", 2) {
        Ok(d) => {
            assert!(iolift_offload::cuda::driver_present());
            eprintln!("GPU present: {}", d.name());
        }
        Err(e) => {
            let msg = e.to_string();
            eprintln!("no GPU here: {msg}");
            assert!(matches!(e, OffloadError::NoGpu(_)), "{e:?}");
            assert!(msg.contains("GPU offload unavailable"), "{msg}");
        }
    }
}

/// Whole-pool mapping on the CPU device == per-PG placement with
/// iolift-crush (pg_to_pps + do_rule, and map_object for named objects).
#[test]
fn whole_pool_matches_per_pg_placement() {
    let dev = device::cpu(2).unwrap();
    let map = straw2_map(300, 6, 5);
    let w: Vec<u32> = (0..300)
        .map(|i| if i % 17 == 0 { 0 } else { 0x10000 })
        .collect();
    let h = MapHandle::new(map, Some(4)).unwrap();
    for (pool, rule, size) in [
        (
            Pool {
                id: 4,
                pg_num: 4096,
                pgp_num: 4096,
                hashpspool: true,
            },
            0,
            3usize,
        ),
        (
            Pool {
                id: 9,
                pg_num: 1000,
                pgp_num: 900,
                hashpspool: false,
            },
            0,
            3,
        ),
        (
            Pool {
                id: 2,
                pg_num: 2048,
                pgp_num: 2048,
                hashpspool: true,
            },
            1,
            6,
        ),
    ] {
        let m = crush::map_pool(&*dev, &h, &pool, rule, size, &w).unwrap();
        assert_eq!(m.len(), pool.pg_num as usize);
        let mut ws = Workspace::new(&h.map, size);
        let mut row = vec![0; size];
        for ps in 0..pool.pg_num {
            let n = do_rule(
                &h.map,
                rule,
                pg_to_pps(&pool, ps) as i32,
                &mut row,
                &w,
                &mut ws,
                None,
            );
            assert_eq!(m.row(ps as usize), &row[..n], "pool {} ps {ps}", pool.id);
            if rule == 1 {
                assert_eq!(n, size, "indep keeps positions");
            }
        }
        for i in 0..200 {
            let name = format!("obj-{i}");
            let p = map_object(&h.map, &pool, None, &name, rule, size, &w).unwrap();
            assert_eq!(m.row(p.ps as usize), &p.osds[..], "{name}");
        }
    }
    // the same through the pool-sized inline path (one processing element)
    let pool = Pool {
        id: 4,
        pg_num: 512,
        pgp_num: 512,
        hashpspool: true,
    };
    let a = crush::map_pool(&*dev, &h, &pool, 0, 3, &w).unwrap();
    let b = crush::map_on(&*dev, 0, &h, 0, Inputs::Pool(&pool), 3, &w).unwrap();
    assert_eq!(a, b);
}

/// `crush test --device` helper: walks the same (rule, numrep, x) range as
/// the tester and counts what it compared.
#[test]
fn verify_test_range_walks_the_tester_range() {
    use iolift_crush::tester::TestOptions;
    let dev = device::cpu(1).unwrap();
    let map = straw2_map(40, 4, 2);
    let o = TestOptions {
        min_x: 0,
        max_x: 99,
        min_rule: 0,
        max_rule: 0,
        min_rep: 2,
        max_rep: 4,
        ..Default::default()
    };
    assert_eq!(
        iolift_offload::kernels::crush::check::verify_test_range(&*dev, &map, &o).unwrap(),
        300
    );
    // default x (0..1023) and rules (all), pool-id hashing of x
    let o = TestOptions {
        pool_id: 5,
        min_rep: 3,
        max_rep: 3,
        ..Default::default()
    };
    assert_eq!(
        iolift_offload::kernels::crush::check::verify_test_range(&*dev, &map, &o).unwrap(),
        2 * 1024
    );
}
