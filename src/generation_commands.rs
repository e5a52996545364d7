//! The generation commands: `lora-ft chat` (a conversation on stdin, or one prompt) and
//! `lora-ft generate` (a prompts file answered into a completions file).

use std::io::{BufRead, Write};
use std::path::Path;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use lora_ft::data::{ChatTokenizer, Message};
use lora_ft::generate::completions::{write_jsonl, Completions};
use lora_ft::generate::prompts::read_prompts;
use lora_ft::generate::{reply_with_tools, stop_ids};
use lora_ft::model::{CausalLm, LoraSpec};
use lora_ft::train::select_device;
use minijinja::Value;

use crate::cli::{parse_quantization, ChatArgs, GenerateArgs, LoadingArgs};

/// `--batch` where it is not given on the CPU.
const DEFAULT_BATCH: usize = 16;

/// A model ready to answer: loaded on the device, its adapter added, its tokenizer and template,
/// the tools of `--tools` and its stop ids.
struct Loaded {
    model: CausalLm,
    tokenizer: ChatTokenizer,
    tools: Option<Vec<Value>>,
    stop: Vec<u32>,
}

impl Loaded {
    fn load(
        model: &str,
        loading: &LoadingArgs,
        adapter: Option<&Path>,
        tools: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let (mut model, tokenizer, stop) = load_base(model, loading)?;
        if let Some(adapter) = adapter {
            lora_ft::peft_adapter::load_adapter(&mut model, adapter)
                .with_context(|| format!("loading adapter {}", adapter.display()))?;
        }
        let tools = tools.map(lora_ft::data::read_tools_file).transpose()?;
        Ok(Self { model, tokenizer, tools, stop })
    }
}

/// The base model on the device (f32 on the CPU, bf16 on a GPU), its tokenizer and chat template
/// and its stop ids: what `chat`, `generate` and `serve` load.
pub fn load_base(model: &str, loading: &LoadingArgs) -> anyhow::Result<(CausalLm, ChatTokenizer, Vec<u32>)> {
    let device = select_device()?;
    let files = lora_ft::hub::resolve(model, &loading.revision)?;
    let dtype = if device.is_cpu() { candle_core::DType::F32 } else { candle_core::DType::BF16 };
    let quantization = parse_quantization(&loading.quantization);
    let model = CausalLm::load(&files.config, &files.weights, dtype, quantization, &device)?;
    let tokenizer = ChatTokenizer::load(&files.dir, loading.chat_template.as_deref())?;
    let stop = stop_ids(&files.dir, &tokenizer);
    Ok((model, tokenizer, stop))
}

/// Sequence length and batch where the flags (`given`) leave them: on a GPU the serving
/// planner's (`lora_ft::plan::serving::choose`) for the memory the device has left once the
/// model is loaded — `VramBudget`'s share of the card, less what the device already holds (the
/// weights, the CUDA context, other processes) and the adapters still to load (`pending`); on
/// the CPU `cpu` for what is not given. The choice and its reason go to the log; where nothing
/// fits, the error ends with `hint` (what the user can shorten).
pub fn plan_serving(
    model: &CausalLm,
    loading: &LoadingArgs,
    pending: &[LoraSpec],
    (given, cpu): ((Option<usize>, Option<usize>), (usize, usize)),
    max_prefill_tokens: Option<usize>,
    hint: &str,
) -> anyhow::Result<(usize, usize)> {
    use lora_ft::plan::serving::{adapter_bytes, choose, ServingPlan, ServingShape};
    let Some(memory) = lora_ft::memory::device_memory(model.device()) else {
        return Ok((given.0.unwrap_or(cpu.0), given.1.unwrap_or(cpu.1)));
    };
    let m = model.config();
    let nf4 = match parse_quantization(&loading.quantization) {
        lora_ft::quant::Quantization::Nf4 { double_quant } => Some(double_quant),
        _ => None,
    };
    let shape = ServingShape {
        dtype: model.dtype(),
        nf4,
        adapters: pending.to_vec(),
        gpu: true,
        max_prefill_tokens: max_prefill_tokens.unwrap_or(lora_ft::plan::serving::PREFILL_TOKENS),
    };
    let (used, pending_bytes) = (memory.used as u64, pending.iter().map(|s| adapter_bytes(m, s)).sum());
    let plan = |n: usize| ServingPlan::new(m, &shape, n).with_resident(used, pending_bytes);
    let budget = lora_ft::memory::VramBudget::new(memory.total as u64, None);
    let choice = choose(m.max_position_embeddings, plan, budget.bytes(), given)
        .map_err(|e| anyhow::anyhow!("{e}: {hint}"))?;
    let gib = |b: u64| b as f64 / lora_ft::memory::GIB;
    tracing::info!(
        "{} (the budget: {:.2} of the GPU's {:.2} GiB; {:.2} GiB held already: the weights, the CUDA context and \
         any other process)",
        choice.reason,
        budget.fraction,
        gib(budget.total),
        gib(used)
    );
    Ok((choice.max_seq_len, choice.max_batch))
}

pub fn chat(args: &ChatArgs) -> anyhow::Result<()> {
    // a flag out of range is an error before the model loads
    let settings = args.sampling.settings(args.max_new_tokens)?;
    let loaded = Loaded::load(&args.model, &args.loading, args.adapter.as_deref(), args.tools.as_deref())?;
    let Loaded { model, tokenizer, tools, stop } = &loaded;
    let mut messages: Vec<Message> = args.system.iter().map(|s| Message::new("system", s)).collect();
    let answer = |messages: &[Message]| -> anyhow::Result<String> {
        let text = reply_with_tools(model, tokenizer, messages, tools.as_deref(), stop, &settings)?;
        let calls = lora_ft::data::parse_tool_calls(&text);
        println!("{text}");
        calls.iter().for_each(|call| println!("tool call: {call}"));
        Ok(text)
    };
    if let Some(prompt) = &args.prompt {
        messages.push(Message::new("user", prompt));
        answer(&messages)?;
        return Ok(());
    }
    let stdin = std::io::stdin();
    loop {
        print!("> ");
        std::io::stdout().flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            return Ok(());
        }
        messages.push(Message::new("user", line.trim_end()));
        let text = answer(&messages)?;
        messages.push(Message::new("assistant", &text));
    }
}

/// `lora-ft generate`: every prompt of `--input` answered `--n` times into `--output`, written a
/// batch at a time (a run stopped part way keeps the lines written so far).
pub fn generate(args: &GenerateArgs) -> anyhow::Result<()> {
    // the flags and the prompts file are checked before the model loads
    let settings = args.sampling.settings(args.max_new_tokens)?;
    anyhow::ensure!(args.n >= 1, "--n must be at least 1");
    anyhow::ensure!(args.batch.is_none_or(|b| b >= 1), "--batch must be at least 1");
    let prompts = read_prompts(&args.input)?;
    let loaded = Loaded::load(&args.model, &args.loading, args.adapter.as_deref(), args.tools.as_deref())?;
    let file = std::fs::File::create(&args.output)
        .with_context(|| format!("{}: cannot create", args.output.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let bar = ProgressBar::new((prompts.len() * args.n) as u64);
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} replies, {msg} [{elapsed_precise}]")?);
    let started = std::time::Instant::now();
    let mut tokens = 0usize;
    let mut run = Completions {
        model: &loaded.model,
        tokenizer: &loaded.tokenizer,
        tools: loaded.tools.as_deref(),
        stop: &loaded.stop,
        settings: &settings,
        n: args.n,
        batch: args.batch.unwrap_or(DEFAULT_BATCH),
    };
    if args.batch.is_none() && loaded.model.device().is_cuda() {
        // the planner's batch for the longest prompt and its reply
        let longest = prompts
            .iter()
            .map(|p| run.prompt_ids(p).map(|ids| ids.len()))
            .try_fold(0, |a, n| n.map(|n| a.max(n)))?;
        let context = loaded.model.config().max_position_embeddings;
        let length = longest.saturating_add(args.max_new_tokens).min(context);
        let (_, batch) = plan_serving(
            &loaded.model,
            &args.loading,
            &[],
            ((Some(length), None), (length, DEFAULT_BATCH)),
            None,
            "shorten the prompts or --max-new-tokens",
        )?;
        run.batch = batch.min(prompts.len() * args.n).max(1);
    }
    run.run(&prompts, &mut |rows| {
        write_jsonl(&mut out, rows)?;
        out.flush().with_context(|| format!("{}: cannot write", args.output.display()))?;
        tokens += rows.iter().map(|r| r.completion_tokens).sum::<usize>();
        bar.set_message(format!("{:.1} tokens/s", tokens as f64 / started.elapsed().as_secs_f64()));
        bar.inc(rows.len() as u64);
        Ok(())
    })?;
    bar.finish();
    println!(
        "{} replies to {} prompts in {}: {tokens} tokens, {:.1} tokens/s",
        prompts.len() * args.n,
        prompts.len(),
        args.output.display(),
        tokens as f64 / started.elapsed().as_secs_f64()
    );
    Ok(())
}
