//! Selective checkpointing: which decoder layers keep their activations from the forward to the
//! backward instead of only their input. A kept layer's backward reads what its forward left
//! (layer/mod.rs `forward_saving`); the others are recomputed from their checkpoint. The last
//! layers are the ones kept: the backward reaches them first, so their activations are freed
//! before the first recompute needs room, and they push no checkpoint.

use std::sync::Arc;

/// The number of last layers kept at a step of `(seq, batch)`, as the memory planner chose it
/// for the budget (`train.checkpointing`); never more than the model has.
#[derive(Clone)]
pub struct KeptLayers(Arc<dyn Fn((usize, usize)) -> usize + Send + Sync>);

impl KeptLayers {
    /// Every layer recomputed from its input (`checkpointing = "full"`).
    pub fn none() -> Self {
        Self(Arc::new(|_| 0))
    }

    /// No recompute at all (`checkpointing = "none"`).
    pub fn all() -> Self {
        Self(Arc::new(|_| usize::MAX))
    }

    /// `count(seq, batch)` layers, e.g. the planner's choice within a memory budget.
    pub fn by(count: impl Fn((usize, usize)) -> usize + Send + Sync + 'static) -> Self {
        Self(Arc::new(count))
    }

    /// The first layer kept of `layers` at a step of `(seq, batch)` (`layers`: none kept).
    pub fn first_kept(&self, layers: usize, shape: (usize, usize)) -> usize {
        layers - (self.0)(shape).min(layers)
    }
}

impl std::fmt::Debug for KeptLayers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeptLayers(..)")
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
}
