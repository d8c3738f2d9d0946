//! Poll mode in the metrics: a live server, a real client (fio's nbd
//! engine at queue depth 1, where poll mode acts), and the per-connection
//! series of `--metrics` (`iolift_nbd_poll_*`, see docs/nbd.md).
//!
//! Needs fio (with its nbd engine) and, for the busy case, stress-ng:
//! both in scripts/test.sh's package list.

mod common;
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Child;
use std::time::{Duration, Instant};

fn scrape(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let (head, body) = r.split_once("\r\n\r\n").expect("HTTP reply");
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    body.to_string()
}

/// Samples of `family` as (labels, value).
fn samples(body: &str, family: &str) -> Vec<(String, f64)> {
    body.lines()
        .filter_map(|l| l.strip_prefix(family)?.strip_prefix('{'))
        .filter_map(|l| {
            let (labels, v) = l.rsplit_once("} ")?;
            Some((labels.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// The connection's current state: the one `state` label with value 1.
fn states_now(body: &str) -> Vec<String> {
    samples(body, "iolift_nbd_poll_state")
        .into_iter()
        .filter(|(_, v)| *v == 1.0)
        .map(|(l, _)| {
            let s = l.split("state=\"").nth(1).expect("state label");
            s[..s.find('"').unwrap()].to_string()
        })
        .collect()
}

fn sum(body: &str, family: &str, label: &str) -> f64 {
    samples(body, family)
        .into_iter()
        .filter(|(l, _)| l.contains(label))
        .map(|(_, v)| v)
        .sum()
}

/// fio 4k randread at queue depth 1 for `secs`, in the background.
fn fio_qd1(uri: &str, secs: u32) -> Child {
    cmd("fio")
        .args([
            "--name=qd1",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randread",
            "--bs=4k",
            "--iodepth=1",
            "--size=16M",
            "--time_based",
            &format!("--runtime={secs}"),
            "--output=/dev/null",
        ])
        .spawn()
        .expect("start fio")
}

/// Starts a server with `args`, runs a QD1 client for 3 s and returns the
/// metrics scraped 1.5 s into it and after it ended.
fn scrape_during_qd1(args: &[&str], busy: bool) -> (String, String) {
    require_tool("fio");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let srv = ServerBuilder::iolift()
        .args(["--metrics", &addr])
        .args(args.iter().copied())
        .backend("memory:16M")
        .start();
    let mut hog: Option<Child> = busy.then(|| {
        require_tool("stress-ng");
        // two hogs per core: they keep each other waiting for a CPU, so
        // the kernel's CPU pressure is high whatever fio and the server
        // do (with one per core the hogs wait only while fio or the
        // server runs)
        let n = 2 * std::thread::available_parallelism().map_or(2, |n| n.get());
        cmd("stress-ng")
            .args(["--cpu", &n.to_string(), "--cpu-method", "int64", "--quiet"])
            .spawn()
            .expect("start stress-ng")
    });
    if busy {
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut fio = fio_qd1(&srv.uri(), 3);
    // Until fio's connection shows up (fio starts slowly on a busy machine).
    let t0 = Instant::now();
    let mut during = scrape(&addr);
    while states_now(&during).is_empty() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
        during = scrape(&addr);
    }
    std::thread::sleep(Duration::from_millis(1500));
    during = scrape(&addr);
    let st = fio.wait().expect("fio");
    if let Some(h) = hog.as_mut() {
        let _ = h.kill();
        let _ = h.wait();
    }
    assert!(st.success(), "fio failed; server: {}", srv.stderr());
    (during, scrape(&addr))
}

#[test]
fn metrics_report_each_poll_mode_per_connection() {
    let _g = heavy();
    // --poll-us 0: off, no polls
    let (during, after) = scrape_during_qd1(&["--poll-us", "0"], false);
    assert_eq!(states_now(&during), ["off"], "{during}");
    assert_eq!(sum(&during, "iolift_nbd_polls_total", "result"), 0.0);
    assert!(
        samples(&during, "iolift_nbd_poll_state")
            .iter()
            .all(|(l, _)| l.starts_with("stage=\"nbd\",instance=\"") && l.contains("export=\"\"")),
        "{during}"
    );
    // the connection's series go when it ends
    assert!(states_now(&after).is_empty(), "{after}");

    // --poll-us 50: fixed, with its budget
    let (during, _) = scrape_during_qd1(&["--poll-us", "50"], false);
    assert_eq!(states_now(&during), ["fixed"], "{during}");
    assert_eq!(sum(&during, "iolift_nbd_poll_budget_us", "export"), 50.0);

    // no flag: off, as with --poll-us 0
    let (during, _) = scrape_during_qd1(&[], false);
    assert_eq!(states_now(&during), ["off"], "{during}");
    assert_eq!(sum(&during, "iolift_nbd_polls_total", "result"), 0.0);

    // auto: adaptive, in one of its own states; a poll's budget stays
    // within the automatic bounds (20-1000 us) or is 0 when not polling
    let (during, _) = scrape_during_qd1(&["--poll-us", "auto"], false);
    let st = states_now(&during);
    assert!(
        st.len() == 1 && ["polling", "idle", "backoff", "unpolled"].contains(&st[0].as_str()),
        "{during}"
    );
    // the judge has compared polled and unpolled request cycles (a probe
    // takes 192 requests; fio at QD1 sends thousands a second) and shows
    // what it measured: both figures, a QD1 cycle on a memory export
    // being microseconds to a few milliseconds. The one excuse: on a busy
    // machine the controller backs off and the probe's polled window
    // cannot finish (its cycles do not poll, so they are not counted).
    let verdicts = sum(&during, "iolift_nbd_poll_verdicts_total", "verdict");
    if verdicts >= 1.0 {
        let cycles = samples(&during, "iolift_nbd_poll_cycle_ns");
        assert_eq!(cycles.len(), 2, "{during}");
        for (l, v) in &cycles {
            assert!((1_000.0..=10_000_000.0).contains(v), "{l} = {v}:\n{during}");
        }
        // After exactly one probe its verdict follows its figures: polling
        // wins only with cycles shorter by more than a fifth (a clear win;
        // nbd/judge.rs, MARGIN).
        if verdicts == 1.0 {
            let ns = |mode: &str| {
                cycles
                    .iter()
                    .find(|(l, _)| l.contains(&format!("mode=\"{mode}\"")))
                    .map(|(_, v)| *v)
                    .unwrap_or_else(|| panic!("no {mode} cycle:\n{during}"))
            };
            let wins = ns("polled") * 5.0 < ns("unpolled") * 4.0;
            let polled = sum(
                &during,
                "iolift_nbd_poll_verdicts_total",
                "verdict=\"poll\"",
            );
            assert_eq!(polled == 1.0, wins, "verdict against figures:\n{during}");
        }
    } else {
        let stall = sum(&during, "iolift_nbd_poll_cpu_stall_permille", "export");
        let busy = sum(&during, "iolift_nbd_poll_backoffs_total", "reason=\"load\"")
            + sum(
                &during,
                "iolift_nbd_poll_backoffs_total",
                "reason=\"descheduled\"",
            );
        assert!(
            stall > 200.0 && busy >= 1.0,
            "no probe finished on a quiet machine:\n{during}"
        );
    }
    if st[0] == "unpolled" {
        assert_eq!(sum(&during, "iolift_nbd_poll_budget_us", "export"), 0.0);
    }
    let b = sum(&during, "iolift_nbd_poll_budget_us", "export");
    assert!(
        b == 0.0 || (20.0..=1000.0).contains(&b),
        "budget {b}:\n{during}"
    );
    if st[0] == "polling" {
        assert!(b >= 20.0, "{during}");
    }
    // the CPU pressure the decision saw: a share, and a polling
    // connection saw a quiet machine (at most 200 per mille)
    let stall = samples(&during, "iolift_nbd_poll_cpu_stall_permille");
    assert_eq!(stall.len(), 1, "{during}");
    assert!((0.0..=1000.0).contains(&stall[0].1), "{during}");
    if st[0] == "polling" {
        assert!(stall[0].1 <= 200.0, "{during}");
    }
}

/// With two CPU hogs on every core (threads kept waiting for a CPU), the
/// adaptive default backs off (CPU pressure or descheduled polls), or
/// never polls because every request is already waiting, and stays off
/// while the load lasts.
#[test]
fn adaptive_poll_backs_off_on_a_busy_machine() {
    let _g = heavy();
    // Either busy signal may fire first: the CPU pressure ("load") or a
    // poll that was itself descheduled; "empty" would be the wrong reason.
    let backoffs = |during: &str| {
        sum(during, "iolift_nbd_poll_backoffs_total", "reason=\"load\"")
            + sum(
                during,
                "iolift_nbd_poll_backoffs_total",
                "reason=\"descheduled\"",
            )
    };
    let during = scrape_during_qd1(&["--poll-us", "auto"], true).0;
    // Or it never needed to: the reader reads the load only when it would
    // poll (a request not there yet), and under the hogs it is preempted
    // after each reply, so fio's next request is often waiting when it
    // looks. Seen in about one run in four on the 2-core VM (2026-11-25):
    // one poll (the first, before the sampler had two reads) in thousands
    // of requests, no back-off, stall 0. Polling more than that without
    // backing off fails.
    let polls = sum(&during, "iolift_nbd_polls_total", "result");
    assert!(backoffs(&during) >= 1.0 || polls <= 2.0, "{during}");
    // off at the end: still backed off, or, where the hog's CPU pressure
    // dipped for a moment and the back-off ended, a probe then found that
    // sleeping wins ("unpolled"); never polling
    let now = states_now(&during);
    assert!(
        now == ["backoff"] || now == ["unpolled"],
        "{now:?}:\n{during}"
    );
    assert_eq!(sum(&during, "iolift_nbd_poll_budget_us", "export"), 0.0);
    // the CPU pressure it saw, where it read it (a server that never
    // polled read it at most once, which only starts the sampler: 0)
    if backoffs(&during) >= 1.0 {
        assert!(
            sum(&during, "iolift_nbd_poll_cpu_stall_permille", "export") > 200.0,
            "{during}"
        );
    }
}
