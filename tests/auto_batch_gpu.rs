//! `batch_size = "auto"` on a GPU: on the tiny Llama fixture, with a budget set at the measured
//! peak of batch 6, the probe search lands on 6 from any start, batch 6 fits and 7 does not; a
//! batch past the card's memory is an out-of-memory probe, and the device works after it.
//! Its own test binary, so no other test allocates from the device's memory pool meanwhile.
#![cfg(feature = "cuda")]

use std::path::Path;

use candle_core::DType;
use lora_ft::memory::VramBudget;
use lora_ft::model::{CausalLm, LoraSpec, PROJECTIONS};
use lora_ft::quant::Quantization;
use lora_ft::train::auto_batch::{probe_step, search, Probe};

/// The fixture's max_position_embeddings: the longest rows, the largest steps per row.
const SEQ: usize = 128;

#[test]
fn probes_find_the_last_batch_within_the_budget() {
    let Ok(device) = lora_ft::train::parse_device("cuda") else {
        eprintln!("no CUDA device: skipped");
        return;
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama");
    let (config, weights) = lora_ft::hub::local_weights(&dir).unwrap();
    let mut model = CausalLm::load(&config, &weights, DType::F32, Quantization::None, &device).unwrap();
    let targets = PROJECTIONS.iter().map(|p| p.to_string()).collect();
    let spec = LoraSpec { r: 8, alpha: 16.0, dropout: 0.0, target_modules: targets, rslora: false };
    model.add_lora(&spec, 0).unwrap();

    let unlimited = VramBudget::new(u64::MAX, Some(1.0));
    let peak = |batch| match probe_step(&model, (SEQ, batch), &unlimited, 0).unwrap() {
        Probe::Fits { peak: Some(peak) } => peak,
        other => panic!("batch {batch}: {other}"),
    };
    peak(1); // anything a first step allocates for good is in every peak after it
    let peaks: Vec<u64> = (1..=12).map(peak).collect();
    // the threshold below means something only if peaks repeat and grow with the batch
    assert_eq!(peak(6), peaks[5]);
    assert!(peaks.windows(2).all(|w| w[0] < w[1]), "peaks by batch: {peaks:?}");

    let budget = VramBudget::new(peaks[5], Some(1.0));
    for start in [1, 5, 6, 7, 12] {
        let chosen = search(start, 24, SEQ, |b| probe_step(&model, (SEQ, b), &budget, 0)).unwrap();
        assert_eq!(chosen, 6, "searching from batch {start}");
    }
    assert_eq!(probe_step(&model, (SEQ, 6), &budget, 0).unwrap(), Probe::Fits { peak: Some(peaks[5]) });
    assert_eq!(probe_step(&model, (SEQ, 7), &budget, 0).unwrap(), Probe::OverBudget { peak: peaks[6] });
    // a batch far past the card's memory is a real CUDA out-of-memory, reported as such, and the
    // device is usable after it
    assert_eq!(probe_step(&model, (SEQ, 1 << 20), &unlimited, 0).unwrap(), Probe::OutOfMemory);
    assert_eq!(probe_step(&model, (SEQ, 6), &budget, 0).unwrap(), Probe::Fits { peak: Some(peaks[5]) });
    // nothing of the probes stays allocated
    let after = lora_ft::memory::pool_memory(&device).unwrap();
    assert!(after.allocated < peaks[0], "{} bytes still allocated", after.allocated);
}
