//! `lora-ft serve` end to end on the tiny random Llama (`common::tiny_smollm2_dir`) on the CPU,
//! over real HTTP: the models listed, chat and text completions whole and streamed (the streamed
//! pieces make the whole reply), errors in OpenAI's shape (bad JSON, a bad field named, unknown
//! model, a prompt past the context, a missing key, a body past the limit), an adapter's replies
//! (as `lora-ft generate --adapter` gives them), adapters loaded and unloaded inside
//! `--adapter-dir` only, 16 clients at once each getting the reply it gets alone, a client that
//! hangs up mid-stream or past its time limit; and on the demo model (SmolLM2-135M-Instruct, real
//! weights) a tool call whole, streamed and through OpenAI's own Python client
//! (`tests/serve/openai_client.py`, from a venv `scripts/openai_install.sh` installs once where
//! `LORA_FT_OPENAI_PYTHON` names none).

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use candle_core::{Device, Tensor};
use serde_json::{json, Value};

const KEY: &str = "sk-serve-test";

/// A running `lora-ft serve`, killed on drop.
struct Server {
    child: Child,
    url: String,
    /// Sent with `post` and `stream` where the server was started with `--api-key`.
    key: Option<String>,
}

impl Server {
    /// Starts the server on the tiny model (its chat template the one with tools) on a free port,
    /// with `extra` flags (`--max-tokens 64` unless they say otherwise); returns once it listens.
    fn start(extra: &[&str]) -> Self {
        Self::start_model(&common::tiny_smollm2_dir(), "tiny", extra)
    }

    /// `start` with another model, served as `name`.
    fn start_model(model: &Path, name: &str, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lora-ft"))
            .args(["serve", model.to_str().unwrap(), "--served-model-name", name])
            .args(["--quantization", "none", "--port", "0", "--chat-template"])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/templates/chatml-tools.jinja"))
            .args(if extra.contains(&"--max-tokens") { &[][..] } else { &["--max-tokens", "64"][..] })
            .args(extra)
            .env_remove("LORA_FT_API_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        // the address from the line it prints once it listens, read on a thread so that a server
        // that never gets there fails the test after two minutes instead of hanging it
        let (tx, rx) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let url = BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .find_map(|line| line.strip_prefix("listening on ").map(str::to_string));
            let _ = tx.send(url);
        });
        let url = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(Some(url)) => url,
            Ok(None) => panic!("lora-ft serve exited before listening: {:?}", child.wait()),
            Err(_) => {
                let _ = child.kill();
                panic!("lora-ft serve did not listen within 2 minutes");
            }
        };
        let key = extra.iter().position(|a| *a == "--api-key").map(|i| extra[i + 1].to_string());
        Server { child, url, key }
    }

    /// `POST path` with a raw body (and the key, where given): the status and the body as JSON
    /// (or as a string where it is not JSON).
    fn post_raw(&self, path: &str, body: &str, key: Option<&str>) -> (u16, Value) {
        let mut request = ureq::post(&format!("{}{path}", self.url))
            .timeout(Duration::from_secs(120))
            .set("Content-Type", "application/json");
        if let Some(key) = key {
            request = request.set("Authorization", &format!("Bearer {key}"));
        }
        respond(request.send_string(body))
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, &body.to_string(), self.key.as_deref())
    }

    fn get(&self, path: &str, key: Option<&str>) -> (u16, Value) {
        let mut request = ureq::get(&format!("{}{path}", self.url)).timeout(Duration::from_secs(60));
        if let Some(key) = key {
            request = request.set("Authorization", &format!("Bearer {key}"));
        }
        respond(request.call())
    }

    /// A streamed request: the `data:` payloads in order, `[DONE]` last.
    fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let mut request = ureq::post(&format!("{}{path}", self.url)).timeout(Duration::from_secs(120));
        if let Some(key) = &self.key {
            request = request.set("Authorization", &format!("Bearer {key}"));
        }
        let response = request.send_string(&body.to_string()).unwrap();
        assert_eq!(response.header("Content-Type"), Some("text/event-stream"));
        let mut text = String::new();
        response.into_reader().read_to_string(&mut text).unwrap();
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        events
            .iter()
            .map(|e| e.strip_prefix("data: ").unwrap_or_else(|| panic!("{e:?}")).to_string())
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn respond(result: Result<ureq::Response, ureq::Error>) -> (u16, Value) {
    let response = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    let status = response.status();
    let text = response.into_string().unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// The error object of an OpenAI-shaped error body, checked for its keys.
fn error(body: &Value) -> &Value {
    let e = &body["error"];
    for key in ["message", "type", "param", "code"] {
        assert!(e.get(key).is_some(), "no {key}: {body}");
    }
    e
}

fn chat_body(user: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": "tiny",
        "messages": [{"role": "system", "content": "You help customers."}, {"role": "user", "content": user}],
        "max_tokens": 6,
        "temperature": 0,
    });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

fn content(reply: &Value) -> String {
    reply["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("{reply}")).to_string()
}

/// A PEFT adapter of the tiny model: random A and B on q, v and down of both layers, large
/// enough to change greedy replies.
fn random_adapter(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let config = json!({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8.0,
        "target_modules": ["q_proj", "v_proj", "down_proj"], "bias": "none",
    });
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    let mut tensors = HashMap::new();
    for layer in 0..2 {
        for (module, out, inp) in
            [("self_attn.q_proj", 64, 64), ("self_attn.v_proj", 32, 64), ("mlp.down_proj", 64, 128)]
        {
            let key = format!("base_model.model.model.layers.{layer}.{module}");
            tensors.insert(
                format!("{key}.lora_A.weight"),
                Tensor::randn(0f32, 0.5, (4, inp), &Device::Cpu).unwrap(),
            );
            tensors.insert(
                format!("{key}.lora_B.weight"),
                Tensor::randn(0f32, 0.5, (out, 4), &Device::Cpu).unwrap(),
            );
        }
    }
    candle_core::safetensors::save(&tensors, dir.join("adapter_model.safetensors")).unwrap();
}

#[test]
fn models_chat_streams_and_completions() {
    let server = Server::start(&[]);
    let (status, models) = server.get("/v1/models", None);
    assert_eq!(status, 200, "{models}");
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(server.get("/health", None).0, 200);
    let (status, body) = server.get("/v1/chat/completions", None);
    assert_eq!(status, 405, "{body}");
    error(&body);
    assert_eq!(error(&server.get("/v1/nothing", None).1)["type"], "invalid_request_error");

    let (status, reply) = server.post("/v1/chat/completions", &chat_body("Where is my order?", json!({})));
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["object"], "chat.completion");
    assert!(reply["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(reply["model"], "tiny");
    assert_eq!(reply["choices"][0]["message"]["role"], "assistant");
    let usage = &reply["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 5, "{usage}");
    assert!(usage["completion_tokens"].as_u64().unwrap() <= 6, "{usage}");
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap())
    );
    let text = content(&reply);

    // streamed: a role chunk, content deltas, a finish chunk, the usage chunk, [DONE]
    let events = server.stream(
        "/v1/chat/completions",
        &chat_body("Where is my order?", json!({"stream": true, "stream_options": {"include_usage": true}})),
    );
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str().map(String::from))
        .collect();
    assert_eq!(streamed, text, "the streamed pieces make the whole reply");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    let finish = &chunks[chunks.len() - 2]["choices"][0]["finish_reason"];
    assert_eq!(finish, &reply["choices"][0]["finish_reason"]);
    assert_eq!(chunks.last().unwrap()["usage"], reply["usage"], "the usage chunk");

    // n samples with a seed: repeatable; logprobs with the top ones
    let body =
        chat_body("Hi", json!({"n": 2, "seed": 11, "temperature": 1.0, "logprobs": true, "top_logprobs": 2}));
    let (status, sampled) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{sampled}");
    assert_eq!(sampled["choices"].as_array().unwrap().len(), 2);
    let entry = &sampled["choices"][0]["logprobs"]["content"][0];
    assert_eq!(entry["top_logprobs"].as_array().unwrap().len(), 2, "{entry}");
    assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
    let again = server.post("/v1/chat/completions", &body).1;
    assert_eq!(content(&again), content(&sampled), "a seed repeats the sample");

    // a stop string ends the reply before it
    let words: Vec<&str> = text.split_whitespace().collect();
    if words.len() > 1 {
        let (_, cut) =
            server.post("/v1/chat/completions", &chat_body("Where is my order?", json!({"stop": words[1]})));
        assert_eq!(cut["choices"][0]["finish_reason"], "stop", "{cut}");
        assert!(text.starts_with(&content(&cut)) && content(&cut).len() < text.len(), "{cut}");
    }

    // text completions: two prompts, whole and streamed
    let body = json!({"model": "tiny", "prompt": ["Once upon a time", "Dear customer"], "max_tokens": 5, "temperature": 0});
    let (status, done) = server.post("/v1/completions", &body);
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["object"], "text_completion");
    let texts: Vec<&str> =
        done["choices"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert_eq!(texts.len(), 2);
    let mut body = body;
    body["stream"] = true.into();
    let events = server.stream("/v1/completions", &body);
    let mut streamed = vec![String::new(); 2];
    for e in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(e).unwrap();
        let choice = &chunk["choices"][0];
        streamed[choice["index"].as_u64().unwrap() as usize].push_str(choice["text"].as_str().unwrap());
    }
    assert_eq!(streamed, texts);
}

#[test]
fn errors_have_openais_shape_and_name_the_field() {
    let server = Server::start(&["--max-body-bytes", "100000", "--max-model-len", "1024"]);
    let (status, body) = server.post_raw("/v1/chat/completions", "{\"messages\": [", None);
    assert_eq!(status, 400, "{body}");
    assert_eq!(error(&body)["type"], "invalid_request_error");

    for (extra, param) in [
        (json!({"temperature": "hot"}), "temperature"),
        (json!({"temperature": -1}), "temperature"),
        (json!({"top_p": 1.5}), "top_p"),
        (json!({"n": 0}), "n"),
        (json!({"max_tokens": 65}), "max_tokens"),
        (json!({"stop": 7}), "stop"),
        (json!({"messages": [{"role": "wizard", "content": "hi"}]}), "messages"),
        (json!({"messages": "hi"}), "messages"),
        (json!({"tool_choice": "required"}), "tools"),
        (json!({"tool_choice": "sometimes"}), "tool_choice"),
        (
            json!({"tools": weather_tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"tools": weather_tools(), "tool_choice": {"type": "function"}}), "tool_choice"),
        (json!({"tools": [{"type": "function"}]}), "tools"),
    ] {
        let (status, body) = server.post("/v1/chat/completions", &chat_body("hi", extra.clone()));
        assert_eq!(status, 400, "{extra}: {body}");
        assert_eq!(error(&body)["param"], param, "{extra}: {body}");
    }
    let (status, body) = server.post("/v1/chat/completions", &chat_body("hi", json!({"model": "nope"})));
    assert_eq!(status, 404, "{body}");
    assert_eq!(error(&body)["code"], "model_not_found");
    let (status, body) = server.post("/v1/completions", &json!({"prompt": 5}));
    assert_eq!((status, error(&body)["param"].as_str()), (400, Some("prompt")), "{body}");

    // past the context (--max-model-len 1024): the prompt alone, and the prompt with max_tokens
    let long = "hello ".repeat(1100);
    let (status, body) = server.post("/v1/completions", &json!({"prompt": long, "max_tokens": 4}));
    assert_eq!(status, 400, "{body}");
    assert_eq!(error(&body)["param"], "prompt");
    assert!(error(&body)["message"].as_str().unwrap().contains("maximum context length"), "{body}");
    let near = "hello ".repeat(980);
    let (status, body) = server.post("/v1/chat/completions", &chat_body(&near, json!({"max_tokens": 64})));
    assert_eq!((status, error(&body)["param"].as_str()), (400, Some("messages")), "{body}");

    // a body past --max-body-bytes: refused from its Content-Length, before it is sent
    let addr = server.url.strip_prefix("http://").unwrap();
    let mut socket = std::net::TcpStream::connect(addr).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        socket,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: 120000\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = socket.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert!(error(&body)["message"].as_str().unwrap().contains("--max-body-bytes"), "{body}");

    // no --adapter-dir: loading is off
    let (status, body) =
        server.post("/v1/load_lora_adapter", &json!({"lora_name": "a", "lora_path": "/tmp"}));
    assert_eq!(status, 403, "{body}");
    assert!(error(&body)["message"].as_str().unwrap().contains("--adapter-dir"));
    // the server still answers
    assert_eq!(server.post("/v1/chat/completions", &chat_body("hi", json!({}))).0, 200);
}

/// A tool whose arguments' schema a random model cannot fill in by chance.
fn weather_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "The weather.", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    }, "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "The time.", "parameters": {"type": "object", "properties": {}}}}])
}

/// Whether a response's `tool_calls` entry calls a tool of `weather_tools` with arguments of its schema.
fn a_weather_call(call: &Value) -> bool {
    let arguments: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    let object = arguments.as_object().unwrap();
    match call["function"]["name"].as_str().unwrap() {
        "get_time" => object.is_empty(),
        "get_weather" => {
            object.keys().all(|k| ["city", "days", "unit"].contains(&k.as_str()))
                && object["city"].as_str().is_some_and(|c| c.chars().count() <= 8)
                && (object["unit"] == "celsius" || object["unit"] == "fahrenheit")
                && object.get("days").is_none_or(|d| d.is_i64() || d.is_u64())
        }
        _ => false,
    }
}

/// `tool_choice` "required" and a named function on the tiny random model: every reply, greedy and
/// sampled, whole and streamed, is calls of the tools with arguments of their schemas (the same
/// request with "auto" makes none).
#[test]
fn required_and_named_tool_choices_constrain_the_reply_to_calls() {
    let server = Server::start(&["--max-tokens", "300"]);
    let extra = |choice: Value, temperature: f64| json!({"tools": weather_tools(), "tool_choice": choice, "n": 4, "temperature": temperature, "seed": 7, "max_tokens": 300});
    let (status, auto) =
        server.post("/v1/chat/completions", &chat_body("Weather in Oslo?", extra("auto".into(), 1.0)));
    assert_eq!(status, 200, "{auto}");
    assert!(auto["choices"].as_array().unwrap().iter().all(|c| c["finish_reason"] != "tool_calls"), "{auto}");
    for temperature in [0.0, 1.0] {
        for (choice, name) in [
            (json!("required"), None),
            (json!({"type": "function", "function": {"name": "get_weather"}}), Some("get_weather")),
        ] {
            let body = chat_body("Weather in Oslo?", extra(choice.clone(), temperature));
            let (status, reply) = server.post("/v1/chat/completions", &body);
            assert_eq!(status, 200, "{reply}");
            for c in reply["choices"].as_array().unwrap() {
                assert_eq!(c["finish_reason"], "tool_calls", "{choice}: {c}");
                assert_eq!(c["message"]["content"], Value::Null, "{c}");
                let calls = c["message"]["tool_calls"].as_array().unwrap();
                assert!(!calls.is_empty() && calls.iter().all(a_weather_call), "{c}");
                if let Some(name) = name {
                    assert_eq!((calls.len(), calls[0]["function"]["name"].as_str()), (1, Some(name)), "{c}");
                }
            }
            let mut streamed = body.clone();
            streamed["stream"] = true.into();
            streamed["n"] = 1.into();
            let events = server.stream("/v1/chat/completions", &streamed);
            let chunks: Vec<Value> =
                events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
            let calls: Vec<&Value> =
                chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
            assert!(
                !calls.is_empty() && calls.iter().all(|c| c.as_array().unwrap().iter().all(a_weather_call)),
                "{events:?}"
            );
            assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls", "{events:?}");
        }
    }
}

#[test]
fn an_api_key_is_required_on_v1() {
    let server = Server::start(&["--api-key", KEY]);
    let (status, body) = server.get("/v1/models", None);
    assert_eq!(status, 401, "{body}");
    assert_eq!(error(&body)["code"], "invalid_api_key");
    assert_eq!(server.get("/v1/models", Some("wrong")).0, 401);
    assert_eq!(server.post_raw("/v1/chat/completions", &chat_body("hi", json!({})).to_string(), None).0, 401);
    assert_eq!(server.get("/v1/models", Some(KEY)).0, 200);
    let (status, body) =
        server.post_raw("/v1/chat/completions", &chat_body("hi", json!({})).to_string(), Some(KEY));
    assert_eq!(status, 200, "{body}");
    assert_eq!(server.get("/health", None).0, 200, "/health needs no key");
}

/// `lora-ft generate`'s greedy reply to `user` (with the adapter, where given).
fn generate_reply(dir: &Path, user: &str, adapter: Option<&Path>) -> String {
    let input = dir.join("prompt.jsonl");
    let row = json!({"messages": [{"role": "system", "content": "You help customers."}, {"role": "user", "content": user}]});
    std::fs::write(&input, format!("{row}\n")).unwrap();
    let out = dir.join("out.jsonl");
    let mut command = Command::new(env!("CARGO_BIN_EXE_lora-ft"));
    command
        .args(["generate", "--model", common::tiny_smollm2_dir().to_str().unwrap(), "--quantization", "none"])
        .args([
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--max-new-tokens",
            "6",
        ])
        .arg("--chat-template")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/templates/chatml-tools.jinja"));
    if let Some(adapter) = adapter {
        command.arg("--adapter").arg(adapter);
    }
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let row: Value =
        serde_json::from_str(std::fs::read_to_string(out).unwrap().lines().next().unwrap()).unwrap();
    row["text"].as_str().unwrap().to_string()
}

#[test]
fn adapters_answer_as_generate_does_and_load_inside_adapter_dir_only() {
    let scratch = common::Scratch::new("serve-adapters");
    let static_adapter = scratch.0.join("static");
    random_adapter(&static_adapter);
    let adapter_dir = scratch.0.join("adapters");
    random_adapter(&adapter_dir.join("b"));
    random_adapter(&scratch.0.join("outside"));
    let spec = format!("a={}", static_adapter.display());
    let server = Server::start(&["--adapter", &spec, "--adapter-dir", adapter_dir.to_str().unwrap()]);

    let (_, models) = server.get("/v1/models", None);
    let ids: Vec<&str> =
        models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["tiny", "a"], "{models}");
    assert_eq!(models["data"][1]["parent"], "tiny");

    let user = "Where is my order?";
    let base = content(&server.post("/v1/chat/completions", &chat_body(user, json!({}))).1);
    let (status, tuned) = server.post("/v1/chat/completions", &chat_body(user, json!({"model": "a"})));
    assert_eq!(status, 200, "{tuned}");
    assert_eq!(tuned["model"], "a");
    let tuned = content(&tuned);
    assert_ne!(tuned, base, "the adapter changes the greedy reply");
    assert_eq!(base, generate_reply(&scratch.0, user, None), "the base as lora-ft generate answers");
    assert_eq!(
        tuned,
        generate_reply(&scratch.0, user, Some(&static_adapter)),
        "as generate --adapter answers"
    );

    // loaded while serving, from inside --adapter-dir only
    for bad in ["../outside", scratch.0.join("outside").to_str().unwrap(), "missing", "/etc"] {
        let (status, body) =
            server.post("/v1/load_lora_adapter", &json!({"lora_name": "x", "lora_path": bad}));
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(error(&body)["param"], "lora_path");
    }
    let (status, body) = server.post("/v1/load_lora_adapter", &json!({"lora_name": "b", "lora_path": "b"}));
    assert_eq!(status, 200, "{body}");
    let (status, reply) = server.post("/v1/chat/completions", &chat_body(user, json!({"model": "b"})));
    assert_eq!(status, 200, "{reply}");
    assert_ne!(content(&reply), base);
    let (status, body) = server.post("/v1/unload_lora_adapter", &json!({"lora_name": "b"}));
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.post("/v1/chat/completions", &chat_body(user, json!({"model": "b"})));
    assert_eq!((status, error(&body)["code"].as_str()), (404, Some("model_not_found")), "{body}");
    let (_, models) = server.get("/v1/models", None);
    assert_eq!(models["data"].as_array().unwrap().len(), 2);
}

#[test]
fn sixteen_clients_at_once_each_get_their_own_reply() {
    let server = Server::start(&["--max-batch", "8"]);
    let bodies: Vec<Value> = (0..16)
        .map(|i| {
            let user = format!("Question {i}: where is order FH-{}?", 1000 + i * 37);
            chat_body(&user, json!({"temperature": 1.0, "seed": i, "max_tokens": 5}))
        })
        .collect();
    let alone: Vec<String> =
        bodies.iter().map(|b| content(&server.post("/v1/chat/completions", b).1)).collect();
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|b| {
                let server = &server;
                s.spawn(move || {
                    let (status, reply) = server.post("/v1/chat/completions", b);
                    assert_eq!(status, 200, "{reply}");
                    content(&reply)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone, "each reply as it is alone");
}

/// Asks for a long stream on a raw socket and hangs up after its first bytes.
fn hang_up_mid_stream(addr: &str, max_tokens: usize) {
    let body = chat_body(
        "Tell me a long story",
        json!({"stream": true, "max_tokens": max_tokens, "temperature": 1.0}),
    )
    .to_string();
    let mut socket = std::net::TcpStream::connect(addr).unwrap();
    write!(
        socket,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 256];
    let n = socket.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
}

#[test]
fn a_client_that_hangs_up_mid_stream_or_times_out_frees_its_place() {
    // one sequence at a time: hung-up requests that kept their place would hold the next one back
    // for the 2 × 4000 tokens they asked for (about 20 s on the tiny model), freed ones not
    let server = Server::start(&[
        "--max-batch",
        "1",
        "--max-tokens",
        "4096",
        "--max-model-len",
        "8192",
        "--request-timeout-s",
        "2",
    ]);
    let addr = server.url.strip_prefix("http://").unwrap().to_string();
    hang_up_mid_stream(&addr, 4000);
    hang_up_mid_stream(&addr, 4000);
    let started = std::time::Instant::now();
    let (status, reply) = server.post("/v1/chat/completions", &chat_body("hi", json!({})));
    assert_eq!(status, 200, "{reply}");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(6),
        "the next request waited {waited:?}: the hung-up ones kept their place"
    );

    // a request past --request-timeout-s: a 504, and its place freed too
    let (status, body) = server.post("/v1/chat/completions", &chat_body("hi", json!({"max_tokens": 4000})));
    assert_eq!((status, error(&body)["code"].as_str()), (504, Some("timeout")), "{body}");
    let (status, reply) = server.post("/v1/chat/completions", &chat_body("hi", json!({})));
    assert_eq!(status, 200, "{reply}");
}

/// A conversation where the assistant looked two orders up with `lookup_order` and is asked of a
/// third: SmolLM2-135M-Instruct answers greedily with a call of its own.
fn tool_call_conversation() -> Value {
    let call = |order: &str, id: &str| {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "lookup_order", "arguments": json!({"order_id": order}).to_string()}}]})
    };
    let result =
        |id: &str| json!({"role": "tool", "tool_call_id": id, "content": "{\"status\": \"shipped\"}"});
    json!({
        "model": "smollm2",
        "messages": [
            {"role": "user", "content": "Where is order FH-2454879?"}, call("FH-2454879", "call_1"), result("call_1"),
            {"role": "assistant", "content": "It shipped."},
            {"role": "user", "content": "Where is order FH-3333333?"}, call("FH-3333333", "call_2"), result("call_2"),
            {"role": "assistant", "content": "It shipped."},
            {"role": "user", "content": "Where is order FH-1111111?"},
        ],
        "tools": [{"type": "function", "function": {"name": "lookup_order", "description": "Look up an order.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}],
        "max_tokens": 36,
        "temperature": 0,
    })
}

/// The demo model (real weights) calls a tool: the call comes back as `tool_calls` whole and as
/// `delta.tool_calls` streamed, and as text with `tool_choice: "none"`; then OpenAI's Python client
/// runs its checks and a tool-calling loop against the same server.
#[test]
fn the_demo_model_calls_tools_whole_streamed_and_through_openais_client() {
    let flags = ["--api-key", KEY, "--max-batch", "4", "--max-model-len", "1024"];
    let server = Server::start_model(&lora_ft::fixtures::smollm2_dir(), "smollm2", &flags);
    let body = tool_call_conversation();
    let (status, reply) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
    assert_eq!(choice["message"]["content"], Value::Null, "{reply}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    assert_eq!(call["function"]["name"], "lookup_order");
    let arguments: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"order_id": "FH-1111111"}));

    let mut streamed = body.clone();
    streamed["stream"] = true.into();
    let events = server.stream("/v1/chat/completions", &streamed);
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, "", "the call is held back, not streamed as text");
    let calls: Vec<&Value> =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
    assert_eq!(calls.len(), 1, "{events:?}");
    assert_eq!(calls[0][0]["index"], 0);
    assert_eq!(calls[0][0]["function"], call["function"], "the streamed call is the whole reply's");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");

    let mut none = body.clone();
    none["tool_choice"] = "none".into();
    let (_, plain) = server.post("/v1/chat/completions", &none);
    assert!(content(&plain).contains("<tool_call>"), "{plain}");
    assert!(plain["choices"][0]["message"].get("tool_calls").is_none(), "{plain}");

    let python = openai_python();
    let out = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/serve/openai_client.py"))
        .args([&format!("{}/v1", server.url), KEY, "smollm2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tests/serve/openai_client.py: {text}");
    eprintln!("{text}");
}

/// `LORA_FT_OPENAI_PYTHON`, else the venv of `scripts/openai_install.sh` in the cache folder,
/// installed here (one test process at a time, through a lock file) where it is missing.
fn openai_python() -> PathBuf {
    if let Some(python) = std::env::var_os("LORA_FT_OPENAI_PYTHON") {
        return PathBuf::from(python);
    }
    let python = lora_ft::cache::dir().join("openai/venv/bin/python3");
    let imports =
        || Command::new(&python).args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success());
    common::install_once("openai", "openai_install.sh", "python3 -m venv and PyPI", imports);
    assert!(imports(), "{} cannot import openai: run `bash scripts/openai_install.sh`", python.display());
    python
}
