//! Selective checkpointing: which decoder layers keep their activations from the forward to the
//! backward instead of only their input. A kept layer's backward reads what its forward left
//! (layer/mod.rs `forward_saving`); the others are recomputed from their checkpoint. The last
//! layers are the ones kept on the device: the backward reaches them first, so their
//! activations are freed before the first recompute needs room, and they push no checkpoint.
//! Where the device has no room left, layers can keep their activations in page-locked host
//! memory instead (`layer_offload.rs`): each is copied out while the next layers compute and
//! brought back ahead of its backward, so it costs PCIe time, not a recompute. Those are spread
//! `stride` layers apart from `stride` layers below the last one down: each copy out has the
//! forward of the layers after it to hide behind, and each copy in the backward of the layers
//! above it (the backward starts with the last layer, which is never offloaded).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How many layers a step keeps, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LayerPlan {
    /// Layers whose activations stay on the device: the last ones not offloaded.
    pub kept: usize,
    /// Layers whose activations wait in host memory.
    pub offloaded: usize,
    /// Layers from one offloaded layer to the next (at least 1).
    pub stride: usize,
    /// An lm_head otherwise streamed from host memory for the loss (ops/lm_head.rs) stays on the
    /// device for this shape: its bytes cost no layer a recompute.
    pub lm_head_resident: bool,
    /// Of the layers kept on the device, the highest ones that also keep what one cheap kernel
    /// gives back (n1, n2 and the gated product) instead of running it again in the backward:
    /// where every layer is kept and memory is left over.
    pub complete: usize,
    /// Of an lm_head streamed for the loss (ops/lm_head.rs), the first chunks (`VOCAB_CHUNK`
    /// rows each) copied to the device while the forward's last `lm_head_prefetch_lead` layers
    /// compute, as many as the loss's moment leaves under the step's peak: the loss then streams
    /// only the rest over the PCIe link, which the forward leaves idle in that direction.
    pub lm_head_prefetch: usize,
    /// Layers before the forward's end at which the prefetch starts.
    pub lm_head_prefetch_lead: usize,
    /// The most layers the host budget and the offload positions take (`offloaded` or more):
    /// a layer a step gives up on the device goes to host memory while there is room, not to a
    /// recompute (`KeptLayers::keep_fewer`).
    pub offload_room: usize,
}

/// What a layer keeps for its backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Its input alone: recomputed in the backward.
    Recomputed,
    /// Its activations, on the device, less what one cheap kernel gives back.
    Kept,
    /// Its activations, on the device, all of them.
    KeptAll,
    /// Its activations, in host memory.
    Offloaded,
}

impl LayerPlan {
    /// Every layer recomputed.
    pub const NONE: Self = Self {
        kept: 0,
        offloaded: 0,
        stride: 1,
        lm_head_resident: false,
        complete: 0,
        lm_head_prefetch: 0,
        lm_head_prefetch_lead: 0,
        offload_room: 0,
    };

    /// Each of `layers` layers' kind: offloaded ones `stride` layers below the last and every
    /// `stride` layers down from there, then the highest of the others kept (the highest
    /// `complete` of those keeping all), the rest recomputed.
    pub fn kinds(&self, layers: usize) -> Vec<LayerKind> {
        let mut kinds = vec![LayerKind::Recomputed; layers];
        for l in self.offload_positions(layers).take(self.offloaded) {
            kinds[l] = LayerKind::Offloaded;
        }
        let mut kept = 0;
        for kind in kinds.iter_mut().rev() {
            if kept == self.kept {
                break;
            }
            if *kind == LayerKind::Recomputed {
                *kind = if kept < self.complete { LayerKind::KeptAll } else { LayerKind::Kept };
                kept += 1;
            }
        }
        kinds
    }

    /// Where offloaded layers can go, highest first.
    pub fn offload_positions(&self, layers: usize) -> impl Iterator<Item = usize> {
        let stride = self.stride.max(1);
        (0..layers).rev().skip(stride).step_by(stride)
    }

    /// Layers not recomputed (kept on the device or in host memory), of `layers`.
    pub fn whole(&self, layers: usize) -> usize {
        self.kinds(layers).iter().filter(|k| **k != LayerKind::Recomputed).count()
    }
}

type Count = dyn Fn((usize, usize)) -> LayerPlan + Send + Sync;

/// The layers kept at a step of `(seq, batch)`, as the memory planner chose them for the budget
/// (`train.checkpointing`), asked once per shape; never more than the model has. A step that
/// runs out of memory, or whose measured peak goes over the budget, keeps one layer fewer on the
/// device at its shapes from then on (`keep_fewer`) rather than stopping; the other shapes keep
/// their plans (each is planned to the budget on its own: one shape's pool running out says
/// nothing of another's).
#[derive(Clone)]
pub struct KeptLayers {
    count: Arc<Count>,
    /// The plan of each shape seen, so that the planner runs once per shape, not per step.
    chosen: Arc<Mutex<HashMap<(usize, usize), LayerPlan>>>,
    /// Layers taken off a shape's device count by `keep_fewer`.
    fewer: Arc<Mutex<HashMap<(usize, usize), usize>>>,
    /// The shapes planned since `begin_step`: the ones `keep_fewer` takes a layer off.
    stepping: Arc<Mutex<Vec<(usize, usize)>>>,
    /// The shapes of steps that ran again with the memory pool trimmed (`trimmed_before`).
    trimmed: Arc<Mutex<Vec<(usize, usize)>>>,
}

impl KeptLayers {
    /// Every layer recomputed from its input (`checkpointing = "full"`).
    pub fn none() -> Self {
        Self::by(|_| LayerPlan::NONE)
    }

    /// No recompute at all (`checkpointing = "none"`).
    pub fn all() -> Self {
        Self::by(|_| LayerPlan { kept: usize::MAX, ..LayerPlan::NONE })
    }

    /// The last `n` layers kept on the device at every shape.
    pub fn last(n: usize) -> Self {
        Self::by(move |_| LayerPlan { kept: n, ..LayerPlan::NONE })
    }

    /// `count(seq, batch)`, e.g. the planner's choice within a memory budget.
    pub fn by(count: impl Fn((usize, usize)) -> LayerPlan + Send + Sync + 'static) -> Self {
        Self {
            count: Arc::new(count),
            chosen: Default::default(),
            fewer: Default::default(),
            stepping: Default::default(),
            trimmed: Default::default(),
        }
    }

    /// A step starts (or runs again): the shapes it plans are the ones `keep_fewer` then means.
    pub fn begin_step(&self) {
        lock(&self.stepping).clear();
    }

    /// The plan at a step of `(seq, batch)`, less the layers `keep_fewer` took off.
    pub fn plan(&self, shape: (usize, usize)) -> LayerPlan {
        self.plan_growing(shape).0
    }

    /// `plan`, and whether the shape has more tokens than every one asked for before it (the
    /// first one included): where the step's buffers outgrow all the earlier ones.
    pub fn plan_growing(&self, shape: (usize, usize)) -> (LayerPlan, bool) {
        let mut chosen = lock(&self.chosen);
        let tokens = |(s, b): (usize, usize)| s * b;
        // a shape seen before never grows: the scan runs once per new shape, not every step
        let grows = !chosen.contains_key(&shape) && chosen.keys().all(|&seen| tokens(seen) < tokens(shape));
        let plan = *chosen.entry(shape).or_insert_with(|| (self.count)(shape));
        drop(chosen);
        let mut stepping = lock(&self.stepping);
        if !stepping.contains(&shape) {
            stepping.push(shape);
        }
        drop(stepping);
        (self.less_fewer(shape, plan), grows)
    }

    fn less_fewer(&self, shape: (usize, usize), plan: LayerPlan) -> LayerPlan {
        match lock(&self.fewer).get(&shape).copied().unwrap_or(0) {
            0 => plan,
            // a step over its budget sheds the complete layers' extra activations too; the layers
            // given up wait in host memory where the plan has room for them (the one in flight
            // is there already), else they are recomputed
            fewer => {
                let kept = plan.kept.saturating_sub(fewer);
                let moved = (plan.kept - kept).min(plan.offload_room.saturating_sub(plan.offloaded));
                LayerPlan { kept, offloaded: plan.offloaded + moved, complete: 0, ..plan }
            }
        }
    }

    /// Each of `layers` layers' kind at a step of `(seq, batch)`.
    pub fn kinds(&self, layers: usize, shape: (usize, usize)) -> Vec<LayerKind> {
        self.plan(shape).kinds(layers)
    }

    /// Marks the shapes the step since `begin_step` planned as run again with the memory pool
    /// trimmed; whether each of them had been before (none planned: `false`). A shape whose
    /// pool runs out again after a trim gives up a layer rather than be trimmed step after step
    /// (a large model at a tight budget ran out step after step, each fitting once trimmed:
    /// benches/code_notes.md).
    pub fn trimmed_before(&self) -> bool {
        let stepping = lock(&self.stepping);
        let mut trimmed = lock(&self.trimmed);
        let before = !stepping.is_empty() && stepping.iter().all(|s| trimmed.contains(s));
        for shape in stepping.iter() {
            if !trimmed.contains(shape) {
                trimmed.push(*shape);
            }
        }
        before
    }

    /// One layer fewer kept on the device at each shape the step since `begin_step` planned
    /// that still keeps one (`layers` in the model), in host memory instead where the plan has
    /// room there: whether any could. For a step that ran out of memory or whose peak went over
    /// the budget.
    pub fn keep_fewer(&self, layers: usize) -> bool {
        let chosen = lock(&self.chosen);
        let mut fewer = lock(&self.fewer);
        let mut any = false;
        for shape in lock(&self.stepping).iter() {
            let kept = chosen.get(shape).map_or(0, |p| p.kept.min(layers));
            let taken = fewer.entry(*shape).or_insert(0);
            if kept > *taken {
                *taken += 1;
                any = true;
            }
        }
        any
    }
}

/// The memo's lock (a panic while it was held leaves plans that are still whole).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl std::fmt::Debug for KeptLayers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeptLayers(fewer: {:?})", lock(&self.fewer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use LayerKind::{Kept as K, Offloaded as O, Recomputed as R};

    fn kept_count(k: &KeptLayers, layers: usize, shape: (usize, usize)) -> usize {
        k.kinds(layers, shape).iter().filter(|&&k| k == K).count()
    }

    #[test]
    fn the_last_layers_are_kept() {
        assert_eq!(KeptLayers::none().kinds(4, (2048, 8)), [R, R, R, R]);
        assert_eq!(KeptLayers::all().kinds(4, (2048, 8)), [K, K, K, K]);
        let by_tokens = KeptLayers::by(|(s, b)| LayerPlan { kept: 40_000 / (s * b), ..LayerPlan::NONE });
        assert_eq!(kept_count(&by_tokens, 32, (512, 8)), 9);
        assert_eq!(by_tokens.kinds(32, (512, 8))[23..], [K; 9]);
        assert_eq!(kept_count(&by_tokens, 32, (2048, 8)), 2);
        assert_eq!(kept_count(&by_tokens, 32, (512, 1)), 32);
    }

    #[test]
    fn offloaded_layers_are_spread_down_from_the_last_and_the_kept_fill_above_the_recomputed() {
        let plan = LayerPlan { kept: 2, offloaded: 3, stride: 3, ..LayerPlan::NONE };
        assert_eq!(plan.kinds(10), [O, R, R, O, R, R, O, R, K, K]);
        assert_eq!(plan.whole(10), 5);
        // more offloaded than the stride leaves room for: as many as fit
        let crowded = LayerPlan { kept: 0, offloaded: 9, stride: 4, ..LayerPlan::NONE };
        assert_eq!(crowded.kinds(10), [R, O, R, R, R, O, R, R, R, R]);
        // more kept than there are layers left
        assert_eq!(
            LayerPlan { kept: 99, offloaded: 2, stride: 1, ..LayerPlan::NONE }.kinds(5),
            [K, K, O, O, K]
        );
        assert_eq!(LayerPlan { kept: 0, offloaded: 99, stride: 1, ..LayerPlan::NONE }.kinds(3), [O, O, R]);
    }

    #[test]
    fn the_planner_is_asked_once_per_shape() {
        let asked = Arc::new(AtomicUsize::new(0));
        let counter = asked.clone();
        let kept = KeptLayers::by(move |_| {
            counter.fetch_add(1, Ordering::Relaxed);
            LayerPlan { kept: 5, ..LayerPlan::NONE }
        });
        for _ in 0..3 {
            assert_eq!(kept_count(&kept, 32, (512, 8)), 5);
            assert_eq!(kept_count(&kept.clone(), 32, (1024, 4)), 5);
        }
        assert_eq!(asked.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn keep_fewer_takes_a_layer_off_the_steps_shapes_until_none_is_kept() {
        let kept =
            KeptLayers::by(|(s, _)| LayerPlan { kept: if s == 512 { 2 } else { 1 }, ..LayerPlan::NONE });
        assert!(!kept.keep_fewer(32), "no shape seen yet, nothing to take off");
        // a step of two micro-batches of different shapes: both give a layer up
        assert_eq!(kept_count(&kept, 32, (512, 8)), 2);
        assert_eq!(kept_count(&kept, 32, (2048, 8)), 1);
        assert!(kept.keep_fewer(32));
        assert_eq!((kept_count(&kept, 32, (512, 8)), kept_count(&kept, 32, (2048, 8))), (1, 0));
        assert!(kept.keep_fewer(32), "512 x 8 still keeps one");
        assert_eq!(kept_count(&kept, 32, (512, 8)), 0);
        assert!(!kept.keep_fewer(32), "every layer is recomputed already");
        assert!(!KeptLayers::none().keep_fewer(32));
    }

    /// A step of one shape gives up its own layer: the shapes it did not plan keep theirs.
    #[test]
    fn keep_fewer_leaves_the_shapes_the_step_did_not_plan() {
        let kept = KeptLayers::by(|(s, _)| LayerPlan { kept: s / 256, ..LayerPlan::NONE });
        assert_eq!(kept_count(&kept, 32, (2048, 4)), 8);
        kept.begin_step();
        assert_eq!(kept_count(&kept, 32, (512, 8)), 2);
        assert!(kept.keep_fewer(32));
        assert_eq!((kept_count(&kept, 32, (512, 8)), kept_count(&kept, 32, (2048, 4))), (1, 8));
        // the step runs again (begin_step) and fails at the same shape: one more off it alone
        kept.begin_step();
        assert_eq!(kept_count(&kept, 32, (512, 8)), 1);
        assert!(kept.keep_fewer(32));
        kept.begin_step();
        assert_eq!(kept_count(&kept, 32, (512, 8)), 0);
        assert!(!kept.keep_fewer(32), "the step's shape keeps none");
        assert_eq!(kept_count(&kept, 32, (2048, 4)), 8);
        kept.begin_step();
        assert!(!kept.keep_fewer(32), "a step that planned nothing gives nothing up");
    }

    #[test]
    fn a_shape_is_trimmed_once_then_gives_up_a_layer() {
        let kept = KeptLayers::all();
        kept.begin_step();
        assert!(!kept.trimmed_before(), "no shape planned");
        kept.plan((512, 8));
        assert!(!kept.trimmed_before(), "the first time");
        kept.begin_step();
        kept.plan((512, 8));
        assert!(kept.trimmed_before(), "again");
        // a step of a shape trimmed before and a new one: the new one is trimmed first
        kept.begin_step();
        kept.plan((512, 8));
        kept.plan((2048, 4));
        assert!(!kept.trimmed_before());
        assert!(kept.trimmed_before());
    }

    #[test]
    fn a_shape_grows_where_it_has_more_tokens_than_every_one_before() {
        let kept = KeptLayers::all();
        let grows = |shape| kept.plan_growing(shape).1;
        assert!(grows((512, 2)), "the first shape");
        assert!(!grows((512, 2)), "seen");
        assert!(grows((512, 8)));
        assert!(!grows((2048, 2)), "as many tokens as 512 x 8");
        assert!(!grows((256, 1)), "fewer");
        assert!(grows((2048, 4)));
        assert!(!grows((512, 8)), "seen before");
    }

    #[test]
    fn keep_fewer_leaves_the_offloaded_layers() {
        let kept = KeptLayers::by(|_| LayerPlan { kept: 1, offloaded: 2, stride: 2, ..LayerPlan::NONE });
        assert_eq!(kept.kinds(6, (512, 8)), [R, O, R, O, R, K]);
        assert!(kept.keep_fewer(6));
        assert_eq!(kept.kinds(6, (512, 8)), [R, O, R, O, R, R]);
    }

    /// Where the plan has room in host memory (Qwen3-14B at 512 x 8 on a 24 GiB card: 28 kept,
    /// 12 offloaded of 13 positions), a layer given up goes there: no layer is recomputed until
    /// the room is used up.
    #[test]
    fn keep_fewer_moves_a_layer_to_host_memory_while_there_is_room() {
        let plan = LayerPlan { kept: 8, offloaded: 2, stride: 3, offload_room: 3, ..LayerPlan::NONE };
        assert_eq!(plan.offload_positions(10).collect::<Vec<_>>(), [6, 3, 0]);
        let kept = KeptLayers::by(move |_| plan);
        assert_eq!(kept.kinds(10, (512, 8)), [K, K, K, O, K, K, O, K, K, K]);
        assert!(kept.keep_fewer(10));
        // layer 0 leaves the device for host memory: then the room is used up
        assert_eq!(kept.kinds(10, (512, 8)), [O, K, K, O, K, K, O, K, K, K]);
        assert_eq!(kept.plan((512, 8)), LayerPlan { kept: 7, offloaded: 3, ..plan });
        assert!(kept.keep_fewer(10));
        assert_eq!(kept.kinds(10, (512, 8)), [O, R, K, O, K, K, O, K, K, K]);
        assert_eq!(kept.plan((512, 8)), LayerPlan { kept: 6, offloaded: 3, ..plan });
    }
}
