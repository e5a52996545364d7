//! The engine against `generate` on the tiny chat model: requests of the base and of two
//! adapters in one batch, sampled and greedy, several samples a prompt, more than fit in the
//! batch at once, each reply the one `generate` gives alone; greedy tokens the argmax of the full
//! forward (no cache) on the same prefix; a request dropped mid-way frees its place.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use tokio::sync::mpsc::UnboundedReceiver;

use super::scheduler::Scheduler;
use super::text::ReplyText;
use super::*;
use crate::generate::sampling::SamplingParams;
use crate::generate::stop::FinishReason;
use crate::generate::{generate_detailed, GenerationSettings};
use crate::quant::Quantization;

pub(super) fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-chat")
}

/// The tiny chat model on the CPU, with the adapter in `adapter` where given.
pub(super) fn tiny_model(adapter: Option<&Path>) -> CausalLm {
    let (config, weights) = crate::hub::local_weights(&fixture()).unwrap();
    let mut model = CausalLm::load(&config, &weights, DType::F32, Quantization::None, &Device::Cpu).unwrap();
    if let Some(dir) = adapter {
        crate::peft_adapter::load_adapter(&mut model, dir).unwrap();
    }
    model
}

pub(super) fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(fixture().join("tokenizer.json")).unwrap()
}

/// A second adapter: the fixture's with B negated and doubled, saved into `dir`.
fn other_adapter(dir: &Path) -> PathBuf {
    let mut model = tiny_model(None);
    let spec = crate::peft_adapter::load_adapter(&mut model, &fixture().join("adapter")).unwrap();
    for (name, var) in model.lora_params() {
        if name.contains("lora_B") {
            var.set(&(var.as_tensor() * -2.0).unwrap()).unwrap();
        }
    }
    let out = dir.join("other");
    crate::peft_adapter::save_adapter(&model, &spec, "tiny-chat", &out).unwrap();
    out
}

/// What a request's channel carried, by sample: tokens, sampled log-probs, text, finish.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Reply {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f64>,
    pub text: String,
    pub finish: Option<FinishReason>,
}

pub(super) fn collect(mut events: UnboundedReceiver<Event>, n: usize) -> Vec<Reply> {
    let mut replies = vec![Reply::default(); n];
    let mut open = n;
    while open > 0 {
        match events.blocking_recv().expect("the engine ended a request without finishing it") {
            Event::Token { index, sampled, text } => {
                replies[index].tokens.push(sampled.token);
                replies[index].logprobs.push(sampled.raw_logprob);
                replies[index].text.push_str(&text);
            }
            Event::Finished { index, reason, text, completion_tokens } => {
                assert_eq!(completion_tokens, replies[index].tokens.len());
                replies[index].text.push_str(&text);
                replies[index].finish = Some(reason);
                open -= 1;
            }
            Event::Failed(message) => panic!("{message}"),
        }
    }
    replies
}

pub(super) fn request(
    prompt: Vec<u32>,
    params: SamplingParams,
    seeds: Vec<u64>,
    max_new_tokens: usize,
) -> Request {
    Request {
        prompt,
        params,
        seeds,
        max_new_tokens,
        stop_strings: Vec::new(),
        adapter: None,
        constraint: None,
    }
}

/// The settings `generate` gets for one sample of `request`.
fn settings_of(request: &Request, seed: u64) -> GenerationSettings {
    let p = &request.params;
    GenerationSettings {
        max_new_tokens: request.max_new_tokens,
        temperature: p.temperature,
        top_p: Some(p.top_p),
        seed,
        top_k: p.top_k,
        min_p: p.min_p,
        repetition_penalty: p.repetition_penalty,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
        logprobs: p.logprobs,
        stop_strings: request.stop_strings.clone(),
    }
}

/// Eleven requests over the base and two adapters, three sequences at most in the batch (the
/// prompts of one adapter of one length, prefilled together where they are admitted together): each
/// sample's tokens, log-probs and finish are what `generate` gives it alone on a model with its
/// adapter merged in as `--adapter` loads it, and its streamed text is the reply's decoded text.
#[test]
fn batched_requests_of_several_adapters_equal_each_generated_alone() {
    let scratch = tempdir("engine-adapters");
    let other = other_adapter(&scratch);
    let chat = fixture().join("adapter");
    let engine = Engine::start(
        tiny_model(None),
        tokenizer(),
        vec![2],
        EngineConfig { max_batch: 3, max_seq_len: 1024, enforce_eager: false, max_prefill_tokens: None },
    )
    .unwrap();
    engine.add_adapter("chat", &chat).unwrap();
    engine.add_adapter("other", &other).unwrap();
    assert_eq!(engine.adapters(), ["chat", "other"]);
    let sampled =
        SamplingParams { temperature: 0.9, top_p: 0.95, top_k: Some(50), ..SamplingParams::default() };
    let greedy = SamplingParams { logprobs: Some(2), ..SamplingParams::greedy() };
    let mut requests = Vec::new();
    for i in 0..11u32 {
        let adapter = [None, Some("chat"), Some("other")][i as usize % 3].map(String::from);
        // requests of one adapter share a length, so that their prefills share a forward
        let prompt: Vec<u32> = (5 + i..20 + i + 3 * (i % 3)).collect();
        let (params, seeds) = match i % 2 {
            0 => (greedy.clone(), vec![0]),
            _ => (sampled.clone(), vec![u64::from(i), 100 + u64::from(i)]),
        };
        requests.push(Request { adapter, ..request(prompt, params, seeds, 4 + i as usize % 5) });
    }
    let channels: Vec<_> = requests.iter().map(|r| engine.submit(r.clone()).unwrap()).collect();
    let replies: Vec<Vec<Reply>> =
        channels.into_iter().zip(&requests).map(|(events, r)| collect(events, r.seeds.len())).collect();
    let models = [tiny_model(None), tiny_model(Some(&chat)), tiny_model(Some(&other))];
    let text = tokenizer();
    let decoder = ReplyText::new(&text);
    let mut differ = 0;
    for (r, (request, samples)) in requests.iter().zip(&replies).enumerate() {
        let model = &models[r % 3];
        for (seed, got) in request.seeds.iter().zip(samples) {
            let alone =
                generate_detailed(model, &request.prompt, &[2], &settings_of(request, *seed)).unwrap();
            assert_eq!(got.tokens, alone.tokens, "request {r}, seed {seed}");
            assert_eq!(got.logprobs, alone.sampled.iter().map(|s| s.raw_logprob).collect::<Vec<_>>());
            assert_eq!(got.finish, Some(alone.finish), "request {r}");
            assert_eq!(got.text, decoder.decode(&got.tokens).unwrap(), "request {r}");
        }
        if r % 3 != 0 {
            let base =
                generate_detailed(&models[0], &request.prompt, &[2], &settings_of(request, request.seeds[0]));
            differ += usize::from(base.unwrap().tokens != samples[0].tokens);
        }
    }
    assert!(differ >= 4, "the adapters change the replies: {differ} of 7 differ from the base's");
    drop(scratch);
}

/// Greedy tokens through the caches are the argmax of the whole sequence's forward without a
/// cache at every step, with and without an adapter.
#[test]
fn greedy_tokens_are_the_uncached_forwards_argmax() {
    let chat = fixture().join("adapter");
    for adapter in [None, Some(chat.as_path())] {
        let model = tiny_model(adapter);
        let text = tokenizer();
        let decoder = ReplyText::new(&text);
        let mut scheduler = Scheduler::new(&model, Some(&decoder), vec![], (4, 64)).unwrap();
        let prompts: Vec<Vec<u32>> = (0..3).map(|p| (7..30 + 9 * p).collect()).collect();
        let channels: Vec<_> = prompts
            .iter()
            .map(|p| {
                let (sink, events) = tokio::sync::mpsc::unbounded_channel();
                scheduler.add(request(p.clone(), SamplingParams::greedy(), vec![0], 8), sink).unwrap();
                events
            })
            .collect();
        while !scheduler.is_idle() {
            scheduler.step().unwrap();
        }
        for (prompt, events) in prompts.iter().zip(channels) {
            let reply = collect(events, 1).remove(0);
            assert_eq!(reply.tokens.len(), 8);
            for k in 0..reply.tokens.len() {
                let ids: Vec<u32> = prompt.iter().chain(&reply.tokens[..k]).copied().collect();
                let logits = model
                    .forward(&Tensor::new(ids.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap(), None);
                let last = logits.unwrap().squeeze(0).unwrap().get(ids.len() - 1).unwrap();
                let argmax = last.argmax(0).unwrap().to_scalar::<u32>().unwrap();
                assert_eq!(reply.tokens[k], argmax, "adapter {}, step {k}", adapter.is_some());
            }
        }
    }
}

/// A prefill bound splits a batch's prompts over more forwards (four prompts of 12 tokens under
/// a bound of 24: two forwards, against one without it) and changes no reply.
#[test]
fn a_prefill_bound_splits_the_prompts_not_the_replies() {
    let model = tiny_model(None);
    let run = |limit: Option<usize>| {
        let mut scheduler = Scheduler::new(&model, None, vec![], (4, 64)).unwrap();
        if let Some(tokens) = limit {
            scheduler.limit_prefill(tokens);
        }
        let channels: Vec<_> = (0..4u32)
            .map(|p| {
                let (sink, events) = tokio::sync::mpsc::unbounded_channel();
                scheduler
                    .add(request((p + 3..p + 15).collect(), SamplingParams::greedy(), vec![0], 6), sink)
                    .unwrap();
                events
            })
            .collect();
        scheduler.step().unwrap();
        let forwards = scheduler.prefill_forwards();
        while !scheduler.is_idle() {
            scheduler.step().unwrap();
        }
        let replies: Vec<Vec<u32>> = channels.into_iter().map(|e| collect(e, 1).remove(0).tokens).collect();
        (forwards, replies)
    };
    let (whole, replies) = run(None);
    let (bounded, bounded_replies) = run(Some(24));
    assert_eq!((whole, bounded), (1, 2));
    assert_eq!(replies, bounded_replies);
}

/// A request whose reader is gone leaves the batch at the next step and the waiting one takes its
/// place; the others' replies are unchanged.
#[test]
fn a_dropped_request_frees_its_place() {
    let model = tiny_model(None);
    let mut scheduler = Scheduler::new(&model, None, vec![], (2, 64)).unwrap();
    let mut channels = Vec::new();
    for p in 0..3u32 {
        let (sink, events) = tokio::sync::mpsc::unbounded_channel();
        scheduler.add(request((3 + p..15).collect(), SamplingParams::greedy(), vec![0], 12), sink).unwrap();
        channels.push(Some(events));
    }
    scheduler.step().unwrap();
    assert_eq!(scheduler.live(), 2, "two fit in the batch");
    channels[0] = None;
    scheduler.step().unwrap();
    assert_eq!(scheduler.live(), 2, "the third took the dropped one's place");
    while !scheduler.is_idle() {
        scheduler.step().unwrap();
    }
    for p in 1..3u32 {
        let reply = collect(channels[p as usize].take().unwrap(), 1).remove(0);
        let settings = GenerationSettings { max_new_tokens: 12, ..Default::default() };
        let alone = generate_detailed(&model, &(3 + p..15).collect::<Vec<_>>(), &[], &settings).unwrap();
        assert_eq!(reply.tokens, alone.tokens);
    }
}

/// Refusals name what is wrong; an adapter dropped while it runs finishes its requests.
#[test]
fn bad_requests_are_refused_and_adapters_come_and_go() {
    let engine = Engine::start(
        tiny_model(None),
        tokenizer(),
        vec![2],
        EngineConfig { max_batch: 4, max_seq_len: 1024, enforce_eager: false, max_prefill_tokens: None },
    )
    .unwrap();
    let ok = request(vec![5, 6, 7], SamplingParams::greedy(), vec![0], 3);
    let refused = |r: Request| engine.submit(r).map(|_| ()).unwrap_err().to_string();
    assert!(refused(Request { adapter: Some("nope".into()), ..ok.clone() }).contains("\"nope\""));
    assert!(refused(Request { prompt: vec![1; 1025], ..ok.clone() })
        .contains("1025 tokens, past the model's context of 1024"));
    assert!(refused(Request { prompt: vec![], ..ok.clone() }).contains("empty"));
    assert!(refused(Request { seeds: vec![], ..ok.clone() }).contains("at least one sample"));
    let hot = SamplingParams { temperature: -1.0, ..SamplingParams::greedy() };
    assert!(refused(Request { params: hot, ..ok.clone() }).contains("temperature"));
    assert!(refused(Request { stop_strings: vec![String::new()], ..ok.clone() }).contains("stop strings"));
    let chat = fixture().join("adapter");
    engine.add_adapter("chat", &chat).unwrap();
    let err = engine.add_adapter("chat", &chat).unwrap_err().to_string();
    assert!(err.contains("loaded already"), "{err}");
    let err = format!("{:#}", engine.add_adapter("missing", &fixture().join("no-such-adapter")).unwrap_err());
    assert!(err.contains("adapter_config.json"), "{err}");
    let running =
        engine.submit(Request { adapter: Some("chat".into()), max_new_tokens: 40, ..ok.clone() }).unwrap();
    engine.remove_adapter("chat").unwrap();
    assert!(engine.adapters().is_empty());
    let reply = collect(running, 1).remove(0);
    let alone = GenerationSettings { max_new_tokens: 40, ..settings_of(&ok, 0) };
    let alone = generate_detailed(&tiny_model(Some(&chat)), &ok.prompt, &[2], &alone).unwrap();
    assert_eq!(reply.tokens, alone.tokens, "it finished on the adapter it started with");
    assert!(engine.remove_adapter("chat").unwrap_err().to_string().contains("no adapter named"));
}

/// A scratch folder removed when dropped.
pub(super) fn tempdir(tag: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("lora-ft-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

pub(super) struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Prompts of one length admitted together share one prefill forward (a batch of rows), and
/// each reply is still the one `generate` gives it alone; a reply reaching the cache's length
/// ends there with `length`.
#[test]
fn prompts_of_one_length_prefill_together() {
    let model = tiny_model(Some(&fixture().join("adapter")));
    let mut scheduler = Scheduler::new(&model, None, vec![], (8, 24)).unwrap();
    let sampled = SamplingParams { temperature: 1.1, top_k: Some(40), ..SamplingParams::default() };
    let requests: Vec<Request> = (0..6u32)
        .map(|i| match i % 2 {
            0 => request((i..i + 14).collect(), SamplingParams::greedy(), vec![0], 6),
            _ => request((i..i + 14).collect(), sampled.clone(), vec![u64::from(i), 7], 6),
        })
        .chain([request((40..60).collect(), SamplingParams::greedy(), vec![0], 30)])
        .collect();
    let channels: Vec<_> = requests
        .iter()
        .map(|r| {
            let (sink, events) = tokio::sync::mpsc::unbounded_channel();
            scheduler.add(r.clone(), sink).unwrap();
            events
        })
        .collect();
    scheduler.step().unwrap();
    assert_eq!(scheduler.live(), 7, "three greedy and two of two samples at once; the third of two waits");
    while !scheduler.is_idle() {
        scheduler.step().unwrap();
    }
    for (r, (request, events)) in requests.iter().zip(channels).enumerate() {
        let replies = collect(events, request.seeds.len());
        for (seed, got) in request.seeds.iter().zip(&replies) {
            let settings =
                GenerationSettings { max_new_tokens: request.max_new_tokens, ..settings_of(request, *seed) };
            let alone = generate_detailed(&model, &request.prompt, &[], &settings).unwrap();
            match r {
                6 => {
                    assert_eq!(got.tokens[..], alone.tokens[..4], "the cache holds 24 positions: 20 + 4");
                    assert_eq!(got.finish, Some(FinishReason::Length));
                }
                _ => {
                    assert_eq!((&got.tokens, got.finish), (&alone.tokens, Some(alone.finish)), "request {r}")
                }
            }
        }
    }
}

/// Every batch size is padded to a recorded size at least as large and no larger than the
/// cache's slots, and few sizes are recorded: powers of two to 8, then steps of 8, 32 and 64.
#[test]
fn decode_steps_pad_to_few_batch_sizes() {
    use super::step_graphs::padded_rows;
    let sizes: std::collections::BTreeSet<usize> = (1..=300).map(|b| padded_rows(b, 300)).collect();
    for b in 1..=300 {
        let n = padded_rows(b, 300);
        assert!(b <= n && n <= 300, "{b} rows padded to {n}");
    }
    let expected = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 96, 128, 160, 192, 224, 256, 300];
    assert_eq!(sizes.into_iter().collect::<Vec<_>>(), expected);
    assert_eq!((padded_rows(3, 3), padded_rows(65, 80), padded_rows(257, 1024)), (3, 80, 320));
}
