//! Self-check of the guest harness (scripts/vm/guest.sh and
//! iolift_testkit::guest): a failing guest script must show up as a
//! failure, with the step it failed in, its exit status and its output,
//! and a guest that runs past its limit must be stopped. One boot for the
//! step checks, one short one for the time limit.

mod common;
use common::*;
use iolift_testkit::guest::Guest;
use std::time::Duration;

#[test]
fn failing_step_is_reported() {
    let _h = heavy();
    let out = Guest::new(
        r#"
step first
echo "answer=$((6 * 7))"
step second
echo "on the console before failing"
exit 7
"#,
    )
    .timeout(Duration::from_secs(300))
    .run();
    assert_eq!(out.status.code(), Some(7), "{}", out.report());
    assert_eq!(out.steps_ok(), ["first"], "{}", out.report());
    assert_eq!(
        out.step_failed().as_deref(),
        Some("second (status 7)"),
        "{}",
        out.report()
    );
    assert_eq!(out.value("answer").as_deref(), Some("42"));
    assert!(out.console.contains("on the console before failing"));
    assert!(out.job.join("out.log").exists(), "{}", out.report());
}

#[test]
fn guest_past_its_limit_is_stopped() {
    let _h = heavy();
    // The limit covers the boot too: 3 s ends the guest before or just
    // after its shell starts, never after the sleep.
    let out = Guest::new("step sleep\nsleep 600\n")
        .timeout(Duration::from_secs(3))
        .run();
    assert_eq!(
        out.status.code(),
        Some(124),
        "guest.sh should report a timeout\n{}",
        out.report()
    );
    assert!(out.steps_ok().is_empty(), "{}", out.report());
}
