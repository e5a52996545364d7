//! One decoder layer: x + attn(norm(x)) then h + mlp(norm(h)), with LoRA on its projections;
//! Gemma's layers norm each sublayer's output too: x + norm(attn(norm(x))), h + norm(mlp(norm(h))).
//! `forward` is the cheap pass (inference, and the training forward that keeps only the layer's
//! input); `recompute` is the backward's, keeping exactly what `backward` reads and skipping the
//! one product it never reads (the down projection's base GEMM, ~27% of a pass's weight FLOPs);
//! `forward_saving` is both at once, for tests.

use candle_core::{Result, Tensor};

use super::lora::group::LoraGroup;
use super::lora::linear::{DropoutSeed, LoraLinear};
use super::ops::attention::{attention_packed, reads_strided, AttentionSaved, ScoreRule};
use super::ops::product_sum::ProductSum;
use super::ops::{gated, rms_norm, Rope};
use super::packing::PackedRows;
use crate::arch::Activation;
use crate::profile::section;

mod backward;
mod decode;
mod kv_cache;
mod norms;
mod projections;
mod saved;
mod slot_cache;
pub mod tiles;
pub use kv_cache::KvCache;
use projections::project_into;
pub use slot_cache::{DecodeRows, SlotCache};

#[derive(Debug, Clone)]
pub struct DecoderLayer {
    /// The norm before attention, and the one before the MLP (Llama's `post_attention_layernorm`,
    /// Gemma's `pre_feedforward_layernorm`). Gemma's (1 + w) is stored as that sum.
    pub input_layernorm: Tensor,
    pub post_attention_layernorm: Tensor,
    /// Norms of the attention output and of the MLP output before their residual adds (Gemma's
    /// `post_attention_layernorm` and `post_feedforward_layernorm`).
    pub attn_out_norm: Option<Tensor>,
    pub mlp_out_norm: Option<Tensor>,
    pub activation: Activation,
    /// RMSNorm weights `[head_dim]` over each head of q and of k before RoPE (Qwen3).
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    /// q, k, v, o, gate, up, down (the order of `PROJECTIONS`).
    pub proj: [LoraLinear; 7],
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
}

const Q: usize = 0;
const K: usize = 1;
const V: usize = 2;
const O: usize = 3;
const GATE: usize = 4;
const UP: usize = 5;
const DOWN: usize = 6;

/// Where a forward's keys and values go besides its attention.
enum Cache<'a> {
    /// Nowhere (training, a forward without generation).
    None,
    /// Into the cache of the one sequence generated (or of every row, all of one length).
    One(&'a mut KvCache),
    /// Row r's into its slot (`DecodeRows`): sequences decoded together, one token each, each at
    /// its own length, each row's attention over its own positions.
    Slots(&'a SlotCache, &'a DecodeRows),
}

/// Per-forward context shared by all layers.
pub struct LayerInput<'a> {
    pub rope: &'a Rope,
    /// Additive attention mask `[t, kv_len]`; `None` where the attention masks by position (the
    /// CUDA kernels) or should build it itself.
    pub mask: Option<&'a Tensor>,
    /// Position of the first token (non-zero only with a KV cache).
    pub offset: usize,
    /// The layer's query scale, soft cap and sliding window (the window is also the mask's; the
    /// fused CUDA softmax masks by position).
    pub scores: ScoreRule,
    /// Seed of this layer's LoRA dropout masks; `None` in eval mode.
    pub dropout_seed: Option<u64>,
    /// Packed rows (model/packing.rs): each token's position restarts at every dialogue, and
    /// attention stays inside each (through `mask` on the CPU, the spans on CUDA).
    pub packed: Option<&'a PackedRows>,
    /// The gated MLP runs in row tiles of at most this many `[rows, intermediate]` values once
    /// a pass has more rows than one tile holds (tiles.rs); `MLP_TILE_VALUES` in training.
    pub mlp_tile_values: usize,
}

impl LayerInput<'_> {
    /// RoPE at the input's positions: from `offset` on, or each token's own when packed.
    fn rope(&self, x: &Tensor) -> Result<Tensor> {
        match self.packed {
            Some(p) => self.rope.apply_at(x, &p.positions),
            None => self.rope.apply(x, self.offset),
        }
    }

    fn rope_backward(&self, dy: &Tensor) -> Result<Tensor> {
        match self.packed {
            Some(p) => self.rope.backward_at(dy, &p.positions),
            None => self.rope.backward(dy, self.offset),
        }
    }
}

/// Everything `backward` reads, kept by the recompute: the attention half's and the MLP half's.
/// `backward` consumes it, freeing each activation after its last reader.
pub struct LayerSaved {
    attn: AttnSaved,
    mlp: MlpSaved,
}

/// h1 = x + o(attention(rope(q(n1)), rope(k(n1)), v(n1))), n1 = norm(x) (o's output normed first
/// where there is an output norm); with the LoRA groups of q/k/v and o (`None` on the
/// per-projection path).
struct AttnSaved {
    x: Tensor,
    /// `None` where the layer's activations are kept from the forward: the backward norms x
    /// again (one cheap kernel) instead of holding n1 through the step.
    n1: Option<Tensor>,
    /// q and k before their per-head norms (the norms' backward reads them), where there are.
    q_raw: Option<Tensor>,
    k_raw: Option<Tensor>,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    context: Tensor,
    attention: AttentionSaved,
    qkv: Option<LoraGroup>,
    o: Option<LoraGroup>,
    /// o's output, where its norm's backward reads it.
    o_out: Option<Tensor>,
}

/// out = h1 + down(act), act = act(gate(n2)) ⊙ up(n2), n2 = norm(h1) (down's output normed first
/// where there is an output norm).
struct MlpSaved {
    h1: Tensor,
    /// `None` where kept from the forward: normed again from h1 when the backward reads it.
    n2: Option<Tensor>,
    /// The MLP's own activations; `None` where the rows are many enough that the backward
    /// recomputes them one row tile at a time (tiles.rs) instead.
    inner: Option<MlpInner>,
}

/// gate, up and act with the LoRA groups of gate/up and down.
struct MlpInner {
    gate: Tensor,
    up: Tensor,
    /// `None` where kept from the forward: recomputed from gate and up (one elementwise kernel).
    act: Option<Tensor>,
    gate_up: Option<LoraGroup>,
    down: Option<LoraGroup>,
    /// down's output, where its norm's backward reads it (then the recompute cannot skip it).
    down_out: Option<Tensor>,
}

/// Which of a layer's outputs a pass produces.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// The output alone.
    Forward,
    /// What the backward reads alone.
    Recompute,
    /// Both: a layer whose activations are kept from the forward to the backward (selective
    /// checkpointing) instead of recomputed. It keeps the GEMMs' outputs and leaves out what
    /// one cheap kernel gives back (n1, n2, act); its MLP runs untiled.
    ForwardSaving,
    /// The same keeping n1, n2 and act too, where memory is left over (`LayerKind::KeptAll`).
    ForwardSavingAll,
}

fn seed(input: &LayerInput, proj: usize) -> Option<DropoutSeed> {
    // SplitMix-style mixing so that neighbouring projections get unrelated streams.
    input
        .dropout_seed
        .map(|s| DropoutSeed(s.wrapping_add((proj as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))))
}

impl DecoderLayer {
    /// x `[b, t, hidden]` → `[b, t, hidden]`.
    pub fn forward(&self, x: &Tensor, input: &LayerInput, cache: Option<&mut KvCache>) -> Result<Tensor> {
        let cache = match cache {
            Some(c) => Cache::One(c),
            None => Cache::None,
        };
        let (out, _) = self.run(x, input, cache, Pass::Forward)?;
        out.ok_or_else(|| candle_core::Error::Msg("the forward pass returns the output".into()))
    }

    /// `forward` of one new token for each of the sequences in `rows`, each continuing its own
    /// slot of `cache`: their projections and MLP as one batch, each row's RoPE and attention at
    /// its own position. `input`'s mask and offset are not read.
    pub fn forward_slots(
        &self,
        x: &Tensor,
        input: &LayerInput,
        cache: &SlotCache,
        rows: &DecodeRows,
    ) -> Result<Tensor> {
        if let Some(out) = self.forward_slots_fused(x, input, cache, rows)? {
            return Ok(out);
        }
        let (out, _) = self.run(x, input, Cache::Slots(cache, rows), Pass::Forward)?;
        out.ok_or_else(|| candle_core::Error::Msg("the forward pass returns the output".into()))
    }

    /// What `backward` reads, without the layer's output.
    pub fn recompute(&self, x: &Tensor, input: &LayerInput) -> Result<LayerSaved> {
        let (_, saved) = self.run(x, input, Cache::None, Pass::Recompute)?;
        saved.ok_or_else(|| candle_core::Error::Msg("the recompute keeps the activations".into()))
    }

    /// The output and what `backward` reads, as a layer kept from the forward holds it, less
    /// what one cheap kernel gives back in the backward (n1, n2, act).
    pub fn forward_saving(&self, x: &Tensor, input: &LayerInput) -> Result<(Tensor, LayerSaved)> {
        self.forward_keeping(x, input, Pass::ForwardSaving)
    }

    /// `forward_saving` with n1, n2 and act kept too (a complete layer, `LayerKind::KeptAll`).
    pub fn forward_saving_all(&self, x: &Tensor, input: &LayerInput) -> Result<(Tensor, LayerSaved)> {
        self.forward_keeping(x, input, Pass::ForwardSavingAll)
    }

    fn forward_keeping(&self, x: &Tensor, input: &LayerInput, pass: Pass) -> Result<(Tensor, LayerSaved)> {
        match self.run(x, input, Cache::None, pass)? {
            (Some(out), Some(saved)) => Ok((out, saved)),
            _ => Err(candle_core::Error::Msg("forward_saving returns both".into())),
        }
    }

    /// x `[b·t, n·d]` as `[b, n, t, d]`: a view of the projection's memory where the attention
    /// reads it strided (the CUDA kernels, the CPU's fused path; RoPE keeps the view), else a copy
    /// (the composed attention's matmuls take contiguous heads).
    fn heads(&self, x: &Tensor, (b, t, n): (usize, usize, usize), rule: &ScoreRule) -> Result<Tensor> {
        let view = x.reshape((b, t, n, self.head_dim))?.transpose(1, 2)?;
        if reads_strided(x, rule) {
            return Ok(view);
        }
        view.contiguous()
    }

    fn run(
        &self,
        x: &Tensor,
        input: &LayerInput,
        cache: Cache,
        pass: Pass,
    ) -> Result<(Option<Tensor>, Option<LayerSaved>)> {
        let (b, t, hidden) = x.dims3()?;
        let x2 = x.reshape((b * t, hidden))?;
        let n1 = rms_norm(&x2, &self.input_layernorm, self.rms_norm_eps)?;
        let qkv = self.lora_group(&[Q, K, V], &n1, input)?;
        // each projection's [n, out] output is a temporary of its statement: dropped once its
        // heads are laid out, not kept to the end of `run`
        let group = |i| qkv.as_ref().map(|g| (g, i));
        let (q, q_raw) =
            self.head_norm(self.project(Q, &n1, input, group(0))?, self.q_norm.as_ref(), pass)?;
        let (k, k_raw) =
            self.head_norm(self.project(K, &n1, input, group(1))?, self.k_norm.as_ref(), pass)?;
        let rule = &input.scores;
        let q = self.heads(&q, (b, t, self.n_heads), rule)?;
        let k = self.heads(&k, (b, t, self.n_kv_heads), rule)?;
        let v = self.heads(&self.project(V, &n1, input, group(2))?, (b, t, self.n_kv_heads), rule)?;
        let (q, k, v, (context, attention_saved)) = match cache {
            Cache::Slots(cache, rows) => {
                let context = self.attention_of_slots((&q, &k, &v), input, cache, rows)?;
                (q, k, v, (context, AttentionSaved::nothing()))
            }
            cache => {
                let (q, k) = (input.rope(&q)?, input.rope(&k)?);
                let (k, v) = match cache {
                    Cache::One(cache) => cache.append(&k, &v)?,
                    _ => (k, v),
                };
                let out = section("attention", q.device(), || {
                    attention_packed(&q, &k, &v, (input.mask, input.packed), rule)
                })?;
                (q, k, v, out)
            }
        };
        let context = context.transpose(1, 2)?.reshape((b * t, self.n_heads * self.head_dim))?;
        let attn_out = self.lora_group(&[O], &context, input)?;
        let keep = pass != Pass::Forward;
        let (h1, o_out) = self.sublayer_out(
            &x2,
            O,
            &context,
            input,
            attn_out.as_ref(),
            self.attn_out_norm.as_ref(),
            (true, keep),
        )?;
        let h1 = h1.ok_or_else(|| candle_core::Error::Msg("h1 is always computed".into()))?;
        let n2 = rms_norm(&h1, &self.post_attention_layernorm, self.rms_norm_eps)?;
        // a kept layer leaves out what one cheap kernel gives back in the backward
        let lean = pass == Pass::ForwardSaving;
        let attn = (pass != Pass::Forward).then(|| AttnSaved {
            x: x2,
            n1: (!lean).then_some(n1),
            q_raw,
            k_raw,
            q,
            k,
            v,
            context,
            attention: attention_saved,
            qkv,
            o: attn_out,
            o_out,
        });
        let tiles = self.mlp_tile_rows(b * t, input);
        if !matches!(pass, Pass::ForwardSaving | Pass::ForwardSavingAll) && tiles.is_some() {
            // many rows: the MLP runs a row tile at a time, in the forward and in the backward
            let out = match pass {
                Pass::Forward => Some(self.mlp_forward_tiled(&h1, &n2, input)?.reshape((b, t, hidden))?),
                _ => None,
            };
            let saved = attn.map(|attn| LayerSaved { attn, mlp: MlpSaved { h1, n2: Some(n2), inner: None } });
            return Ok((out, saved));
        }
        let mlp_in = self.lora_group(&[GATE, UP], &n2, input)?;
        let gate = self.project(GATE, &n2, input, mlp_in.as_ref().map(|g| (g, 0)))?;
        let up = self.project(UP, &n2, input, mlp_in.as_ref().map(|g| (g, 1)))?;
        let act = gated(&gate, &up, self.activation)?;
        let mlp_out = self.lora_group(&[DOWN], &act, input)?;
        let (out, down_out) = match (&self.mlp_out_norm, pass) {
            // the recompute skips down's base GEMM: nothing reads its output
            (None, Pass::Recompute) => (None, None),
            (norm, _) => {
                let wanted = (pass != Pass::Recompute, keep);
                self.sublayer_out(&h1, DOWN, &act, input, mlp_out.as_ref(), norm.as_ref(), wanted)?
            }
        };
        let out = out.map(|o| o.reshape((b, t, hidden))).transpose()?;
        let saved = attn.map(|attn| {
            let act = (!lean).then_some(act);
            let inner = MlpInner { gate, up, act, gate_up: mlp_in, down: mlp_out, down_out };
            LayerSaved { attn, mlp: MlpSaved { h1, n2: (!lean).then_some(n2), inner: Some(inner) } }
        });
        Ok((out, saved))
    }

    /// The context `[b, h, 1, d]` of rows that each continue their own slot: row r's q and k
    /// rotated at its position, its keys and values written there, its attention over its slot
    /// (masked by position: `input`'s mask is not read). On CUDA one kernel for every row; on the
    /// CPU a row at a time through the training attention.
    fn attention_of_slots(
        &self,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        input: &LayerInput,
        cache: &SlotCache,
        rows: &DecodeRows,
    ) -> Result<Tensor> {
        if rows.len() != q.dim(0)? {
            candle_core::bail!("{} decode rows for {} rows", rows.len(), q.dim(0)?);
        }
        let limit = cache.capacity();
        let rule = &input.scores;
        #[cfg(feature = "cuda")]
        if q.device().is_cuda() && crate::cuda::decode_attention::HEAD_DIMS.contains(&self.head_dim) {
            use crate::cuda::decode_attention::{decode_attention, rope_write_slots, Scores};
            let (b, h, d) = (rows.len(), self.n_heads, self.head_dim);
            let (cos, sin) = input.rope.tables_to(limit)?;
            let (k_cache, v_cache) = cache.buffers();
            let q = if [&cos, k_cache].iter().all(|t| t.dtype() == q.dtype()) {
                // one launch: q and k rotated, k and v written, q laid out for the attention
                let as_rows = |x: &Tensor, n| x.transpose(1, 2)?.contiguous()?.reshape((b, n, d));
                let (q, k, v) = (as_rows(q, h)?, as_rows(k, self.n_kv_heads)?, as_rows(v, self.n_kv_heads)?);
                section("rope", q.device(), || {
                    rope_write_slots(
                        (&q, &k, &v),
                        (&cos, &sin),
                        (k_cache, v_cache),
                        (&rows.slots_t, &rows.positions_t),
                    )
                })?
            } else {
                let (q, k) = input.rope.apply_rows((q, k), &rows.positions_t, limit)?;
                cache.write(&k, v, rows)?;
                q.transpose(1, 2)?.contiguous()?.reshape((b, h, d))?
            };
            let scores = Scores { scale: rule.scale, softcap: rule.softcap, window: rule.window };
            let context = section("attention", q.device(), || {
                decode_attention(&q, cache.buffers(), (&rows.slots_t, &rows.lens_t), scores)
            })?;
            return context.unsqueeze(2);
        }
        let (q, k) = input.rope.apply_rows((q, k), &rows.positions_t, limit)?;
        cache.write(&k, v, rows)?;
        if !rows.on_host() {
            candle_core::bail!("decode rows given on the device run on CUDA only");
        }
        let contexts = (0..rows.len())
            .map(|r| {
                let (k, v) = cache.seen(rows.slots[r], rows.positions[r] + 1)?;
                let q = q.narrow(0, r, 1)?;
                let (k, v) = match reads_strided(&q, rule) {
                    true => (k, v),
                    false => (k.contiguous()?, v.contiguous()?),
                };
                let q = if reads_strided(&q, rule) { q } else { q.contiguous()? };
                section("attention", q.device(), || attention_packed(&q, &k, &v, (None, None), rule))
                    .map(|(context, _)| context)
            })
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&contexts, 0)
    }

    /// residual + proj(x), or residual + norm(proj(x)) with an output norm: the sum where
    /// `want_sum`, and proj(x) where `keep_y` and the norm's backward will read it.
    #[allow(clippy::too_many_arguments)]
    fn sublayer_out(
        &self,
        residual: &Tensor,
        p: usize,
        x: &Tensor,
        input: &LayerInput,
        group: Option<&LoraGroup>,
        out_norm: Option<&Tensor>,
        (want_sum, keep_y): (bool, bool),
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let Some(w) = out_norm else {
            return Ok((Some(self.residual(residual, p, x, input, group)?), None));
        };
        let y = self.project(p, x, input, group.map(|g| (g, 0)))?;
        let sum = want_sum.then(|| residual + rms_norm(&y, w, self.rms_norm_eps)?).transpose()?;
        Ok((sum, keep_y.then_some(y)))
    }

    /// The shared LoRA pass of projections `projs`, all reading x (`None`: per-projection path).
    fn lora_group(&self, projs: &[usize], x: &Tensor, input: &LayerInput) -> Result<Option<LoraGroup>> {
        let members: Vec<&LoraLinear> = projs.iter().map(|&p| &self.proj[p]).collect();
        LoraGroup::forward(&members, x, input.dropout_seed.is_some())
    }

    /// proj(x): member i of `group`'s low-rank output and the base GEMM, or the projection's own
    /// path, in one buffer.
    fn project(
        &self,
        p: usize,
        x: &Tensor,
        input: &LayerInput,
        group: Option<(&LoraGroup, usize)>,
    ) -> Result<Tensor> {
        let mut out = ProductSum::new();
        self.project_into(p, x, input, group, &mut out)?;
        out.finish()
    }

    fn project_into(
        &self,
        p: usize,
        x: &Tensor,
        input: &LayerInput,
        group: Option<(&LoraGroup, usize)>,
        out: &mut ProductSum,
    ) -> Result<()> {
        project_into(&self.proj[p], x, seed(input, p), group, out)
    }

    /// residual + proj(x), summed in the projection's output buffer.
    fn residual(
        &self,
        residual: &Tensor,
        p: usize,
        x: &Tensor,
        input: &LayerInput,
        group: Option<&LoraGroup>,
    ) -> Result<Tensor> {
        let mut sum = ProductSum::new();
        sum.add_tensor(residual)?;
        self.project_into(p, x, input, group.map(|g| (g, 0)), &mut sum)?;
        sum.finish()
    }
}
