//! Selective checkpointing: which decoder layers keep their activations from the forward to the
//! backward instead of only their input. A kept layer's backward reads what its forward left
//! (layer/mod.rs `forward_saving`); the others are recomputed from their checkpoint. The last
//! layers are the ones kept: the backward reaches them first, so their activations are freed
//! before the first recompute needs room, and they push no checkpoint.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

type Count = dyn Fn((usize, usize)) -> usize + Send + Sync;

/// The number of last layers kept at a step of `(seq, batch)`, as the memory planner chose it
/// for the budget (`train.checkpointing`), asked once per shape; never more than the model has.
/// A run whose measured peak goes over its budget keeps one layer fewer at every shape from then
/// on (`keep_fewer`) rather than stopping.
#[derive(Clone)]
pub struct KeptLayers {
    count: Arc<Count>,
    /// The count of each shape seen, so that the planner runs once per shape, not per step.
    chosen: Arc<Mutex<HashMap<(usize, usize), usize>>>,
    /// Layers taken off every shape's count by `keep_fewer`.
    fewer: Arc<AtomicUsize>,
}

impl KeptLayers {
    /// Every layer recomputed from its input (`checkpointing = "full"`).
    pub fn none() -> Self {
        Self::by(|_| 0)
    }

    /// No recompute at all (`checkpointing = "none"`).
    pub fn all() -> Self {
        Self::by(|_| usize::MAX)
    }

    /// `count(seq, batch)` layers, e.g. the planner's choice within a memory budget.
    pub fn by(count: impl Fn((usize, usize)) -> usize + Send + Sync + 'static) -> Self {
        Self { count: Arc::new(count), chosen: Default::default(), fewer: Default::default() }
    }

    /// The first layer kept of `layers` at a step of `(seq, batch)` (`layers`: none kept).
    pub fn first_kept(&self, layers: usize, shape: (usize, usize)) -> usize {
        let count = *self
            .chosen
            .lock()
            .expect("the kept-layer memo's lock")
            .entry(shape)
            .or_insert_with(|| (self.count)(shape));
        layers - count.saturating_sub(self.fewer.load(Ordering::Relaxed)).min(layers)
    }

    /// One layer fewer kept at every shape, where some shape seen keeps one (`layers` in the
    /// model): whether that was possible. For a step whose peak went over the budget.
    pub fn keep_fewer(&self, layers: usize) -> bool {
        let fewer = self.fewer.load(Ordering::Relaxed);
        let chosen = self.chosen.lock().expect("the kept-layer memo's lock");
        let most = chosen.values().map(|&c| c.min(layers)).max().unwrap_or(0);
        if most <= fewer {
            return false;
        }
        self.fewer.store(fewer + 1, Ordering::Relaxed);
        true
    }
}

impl std::fmt::Debug for KeptLayers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeptLayers(fewer: {})", self.fewer.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_kept_counts_from_the_last_layer() {
        assert_eq!(KeptLayers::none().first_kept(32, (2048, 8)), 32);
        assert_eq!(KeptLayers::all().first_kept(32, (2048, 8)), 0);
        let by_tokens = KeptLayers::by(|(s, b)| 40_000 / (s * b));
        assert_eq!(by_tokens.first_kept(32, (512, 8)), 23);
        assert_eq!(by_tokens.first_kept(32, (2048, 8)), 30);
        assert_eq!(by_tokens.first_kept(32, (512, 1)), 0);
    }

    #[test]
    fn the_planner_is_asked_once_per_shape() {
        let asked = Arc::new(AtomicUsize::new(0));
        let counter = asked.clone();
        let kept = KeptLayers::by(move |_| {
            counter.fetch_add(1, Ordering::Relaxed);
            5
        });
        for _ in 0..3 {
            assert_eq!(kept.first_kept(32, (512, 8)), 27);
            assert_eq!(kept.clone().first_kept(32, (1024, 4)), 27);
        }
        assert_eq!(asked.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn keep_fewer_takes_a_layer_off_every_shape_until_none_is_kept() {
        let kept = KeptLayers::by(|(s, _)| if s == 512 { 2 } else { 1 });
        assert!(!kept.keep_fewer(32), "no shape seen yet, nothing to take off");
        assert_eq!(kept.first_kept(32, (512, 8)), 30);
        assert_eq!(kept.first_kept(32, (2048, 8)), 31);
        assert!(kept.keep_fewer(32));
        assert_eq!((kept.first_kept(32, (512, 8)), kept.first_kept(32, (2048, 8))), (31, 32));
        assert!(kept.keep_fewer(32));
        assert_eq!(kept.first_kept(32, (512, 8)), 32);
        assert!(!kept.keep_fewer(32), "every layer is recomputed already");
        assert!(!KeptLayers::none().keep_fewer(32));
    }
}
