//! A full disk while writing the merged model, reported as both merge commands report it.

use crate::durable;
use std::path::Path;

/// A full disk's error as one message saying that `out` was not created; other errors as they are.
pub(super) fn not_created(e: anyhow::Error, out: &Path) -> anyhow::Error {
    match durable::disk_full_message(&e) {
        Some(text) => anyhow::anyhow!("{text}; {} was not created", out.display()),
        None => e,
    }
}
