//! The real SmolLM2-135M-Instruct end to end on the CPU: the imported model, the shipped data
//! through the chat template, training steps on a repeated batch (the loss must fall), export,
//! reload, identical logits; and `lora-ft train` on a small config, start to finish.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use lora_ft::config::{AdafactorSection, Config, Schedule};
use lora_ft::data::{BatchLoader, ChatTokenizer, TokenizedDataset};
use lora_ft::model::{CausalLm, LoraSpec, PROJECTIONS};
use lora_ft::optim::{clip_grad_norm, Adafactor, LrSchedule};
use lora_ft::peft_adapter::{load_adapter, save_adapter};
use lora_ft::quant::Quantization;

fn smollm2() -> (CausalLm, std::path::PathBuf) {
    let dir = lora_ft::fixtures::smollm2_dir();
    let model = CausalLm::load(
        &dir.join("config.json"),
        &[dir.join("model.safetensors")],
        DType::F32,
        Quantization::None,
        &Device::Cpu,
    )
    .unwrap();
    (model, dir)
}

fn spec() -> LoraSpec {
    LoraSpec {
        r: 8,
        alpha: 16.0,
        dropout: 0.05,
        target_modules: PROJECTIONS.iter().map(|s| s.to_string()).collect(),
        rslora: false,
    }
}

#[test]
fn loss_falls_on_a_repeated_batch_and_export_reloads_identically() {
    let (mut model, dir) = smollm2();
    let tokenizer = ChatTokenizer::from_dir(&dir).unwrap();
    let data = Path::new("datasets/customer-service-v1/train.jsonl");
    let set =
        TokenizedDataset::from_jsonl(data, &tokenizer, 160, lora_ft::config::TruncationSide::Right).unwrap();
    let loader = BatchLoader::new(Arc::new(set.examples), 2, tokenizer.pad_id(), Some(1));
    let batch = loader.epoch(0, 0).next().unwrap();
    let ids =
        Tensor::from_vec(batch.input_ids.clone(), (batch.batch_size, batch.seq_len), &Device::Cpu).unwrap();

    model.add_lora(&spec(), 7).unwrap();
    let before = model.forward(&ids, None).unwrap();
    let params: Vec<_> = model.lora_params().into_iter().map(|(_, v)| v).collect();
    let mut opt = Adafactor::new(params, &AdafactorSection::default(), 0.0).unwrap();
    let schedule = LrSchedule::new(Schedule::Constant, 2e-3, 0, 8);
    let mut losses = Vec::new();
    for step in 0..8 {
        let (_, n) = model.loss(&ids, &batch.labels).unwrap();
        let out = model.forward_backward(&ids, &batch.labels, 1.0 / n as f64, Some(step)).unwrap();
        losses.push(out.loss_sum / out.n_tokens as f64);
        let mut grads = out.grads;
        clip_grad_norm(&mut grads, 1.0).unwrap();
        opt.step(&grads, schedule.lr_at(step as usize)).unwrap();
    }
    eprintln!("losses on a repeated batch: {losses:?}");
    assert!(losses[7] < 0.7 * losses[0], "loss did not fall: {losses:?}");

    let out_dir = std::env::temp_dir().join(format!("lora-ft-e2e-{}", std::process::id()));
    save_adapter(&model, &spec(), &dir.display().to_string(), &out_dir).unwrap();
    let trained = model.forward(&ids, None).unwrap();
    let (mut reloaded, _) = smollm2();
    let loaded_spec = load_adapter(&mut reloaded, &out_dir).unwrap();
    assert_eq!(loaded_spec.r, 8);
    let again = reloaded.forward(&ids, None).unwrap();
    let diff = (&trained - &again).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    assert_eq!(diff, 0.0, "reloaded adapter gives different logits");
    let moved = (&trained - &before).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    assert!(moved > 1e-2, "training did not change the logits");
    std::fs::remove_dir_all(&out_dir).ok();
}

#[test]
fn train_command_runs_start_to_finish() {
    let dir = lora_ft::fixtures::smollm2_dir();
    let run = std::env::temp_dir().join(format!("lora-ft-run-{}", std::process::id()));
    let toml = format!(
        r#"
[model]
source = "{model}"
[lora]
r = 4
alpha = 8
dropout = 0.0
[data]
train = "datasets/customer-service-v1/train.jsonl"
eval = "datasets/customer-service-v1/eval.jsonl"
max_seq_len = 96
[train]
batch_size = 2
grad_accum = 2
max_steps = 3
lr = 1e-3
warmup_steps = 1
eval_batches = 2
compute_dtype = "f32"
device = "cpu"
[checkpoint]
every = 2
keep_last = 1
[output]
dir = "{run}/run"
adapter_name = "smoke"
adapters_dir = "{run}/adapters"
"#,
        model = dir.display(),
        run = run.display()
    );
    let cfg = Config::from_toml(&toml, Path::new("smoke.toml")).unwrap();
    let summary = lora_ft::train::run(&cfg, None).unwrap();
    assert_eq!(summary.steps, 3);
    assert!(summary.first_loss.is_finite() && summary.last_loss.is_finite());
    assert_eq!(summary.first_eval.expect("an eval before the first step").step, 0);
    let eval = summary.last_eval.expect("an eval at the end");
    assert!((eval.eval_ppl - eval.eval_loss.exp()).abs() < 1e-9 * eval.eval_ppl);

    let metrics = std::fs::read_to_string(run.join("run/metrics.jsonl")).unwrap();
    let steps: Vec<serde_json::Value> = metrics.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(steps.iter().filter(|v| v.get("loss").is_some()).count(), 3);
    // keep_last = 1: only the final checkpoint (step 3) is left; step 2 was pruned.
    assert_eq!(lora_ft::train::checkpoint::list(&run.join("run")).unwrap(), vec![3]);
    let exported = run.join("exported");
    lora_ft::peft_adapter::export_checkpoint(&run.join("run/checkpoints/step-3"), &exported).unwrap();
    let a = std::fs::read(exported.join("adapter_model.safetensors")).unwrap();
    let b = std::fs::read(summary.adapter_dir.join("adapter_model.safetensors")).unwrap();
    assert_eq!(a.len(), b.len());
    std::fs::remove_dir_all(&run).ok();
}
