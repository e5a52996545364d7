//! The run's timeouts as people write and read them: seconds, from the environment or in messages.

use std::time::Duration;

/// A duration as people write it: "0.5", "10", "300".
pub fn seconds(d: Duration) -> String {
    let s = (d.as_secs_f64() * 10.0).round() / 10.0;
    format!("{s}")
}

/// A duration in seconds from an environment variable, or `default`.
pub fn env_seconds(name: &str, default: Duration) -> Duration {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| *s > 0.0 && s.is_finite())
        .map_or(default, Duration::from_secs_f64)
}
