//! Stages: devices that wrap the device below them (cache, scheduler, stats,
//! delay, error).
