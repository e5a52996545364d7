//! The gated MLP a tile of rows at a time, for passes with many rows (long rows, large packed
//! batches). gate, up and act — and in the backward d(act), d(gate) and d(up) — are
//! `[rows, intermediate]`, the largest tensors of a layer (3.5 × hidden wide for Llama and
//! Mistral): tiled, a pass holds one tile of each instead of all rows'. The backward's recompute
//! stops at n2 and the backward computes each tile's gate, up and act just before reading them,
//! so no GEMM runs more often than untiled. gate, up and down are dequantized once per pass and
//! shared by the tiles; the LoRA gradients are summed over the tiles in f32; dropout masks are
//! the whole rows' (`DropoutSeed::skip`).

use candle_core::{DType, Result, Tensor};

use super::projections::{backward_shared_input, project_into};
use super::{seed, DecoderLayer, LayerInput, DOWN, GATE, UP};
use crate::model::lora::group::LoraGroup;
use crate::model::lora::linear::{DropoutSeed, LoraGrad, LoraLinear};
use crate::model::ops::product_sum::ProductSum;
use crate::model::ops::{gated, gated_backward, rms_norm, rms_norm_backward, rms_norm_backward_add};
use crate::profile::section;

/// Values of one `[rows, intermediate]` tile in training: 64M (128 MiB in f16), so that
/// 2048 × 8 tokens of a 14336-wide MLP run as four tiles of 4096 rows (GEMMs still large enough
/// to run at full speed) and 512 × 8 untiled.
pub const MLP_TILE_VALUES: usize = 1 << 26;

impl DecoderLayer {
    /// Rows per tile where `rows` rows are more than one tile of `input.mlp_tile_values` holds
    /// (then the tiles are as even as can be); `None` where one pass over all rows fits.
    pub fn mlp_tile_rows(&self, rows: usize, input: &LayerInput) -> Option<usize> {
        tile_rows(rows, self.proj[GATE].base.dims().0, input.mlp_tile_values)
    }

    /// out = h1 + down(act) (h1 + norm(down(act)) with an output norm), a tile at a time.
    pub(super) fn mlp_forward_tiled(&self, h1: &Tensor, n2: &Tensor, input: &LayerInput) -> Result<Tensor> {
        let mlp = TiledMlp::new(self, n2, input)?;
        let mut out = Vec::new();
        for (r0, len) in mlp.tiles() {
            let tile = mlp.tile(r0, len)?;
            let residual = h1.narrow(0, r0, len)?;
            let down = tile.down.as_ref().map(|g| (g, 0));
            out.push(match &self.mlp_out_norm {
                None => {
                    let mut sum = ProductSum::new();
                    sum.add_tensor(&residual)?;
                    project_into(&mlp.projs[2], &tile.act, mlp.seed(2, r0, &tile.act), down, &mut sum)?;
                    sum.finish()?
                }
                Some(w) => {
                    (residual + rms_norm(&mlp.project(2, r0, &tile.act, down)?, w, self.rms_norm_eps)?)?
                }
            });
        }
        Tensor::cat(&out, 0)
    }

    /// d(h1) given d(out) `[n, hidden]`, a tile at a time; the gate, up and down LoRA gradients
    /// into `grads`.
    pub(super) fn mlp_backward_tiled(
        &self,
        h1: &Tensor,
        n2: &Tensor,
        d_out: &Tensor,
        input: &LayerInput,
        grads: &mut [Option<LoraGrad>; 7],
    ) -> Result<Tensor> {
        let mlp = TiledMlp::new(self, n2, input)?;
        let mut sums: [Option<(Tensor, Tensor)>; 3] = Default::default();
        let mut d_h1 = Vec::new();
        for (r0, len) in mlp.tiles() {
            let d_out = d_out.narrow(0, r0, len)?;
            let Tile { n2, gate, up, act, gate_up, down } = mlp.tile(r0, len)?;
            let d_down = match &self.mlp_out_norm {
                None => d_out.clone(),
                Some(w) => {
                    let y = mlp.project(2, r0, &act, down.as_ref().map(|g| (g, 0)))?;
                    rms_norm_backward(&y, w, self.rms_norm_eps, &d_out)?
                }
            };
            let uses = [(&mlp.projs[2], mlp.seed(2, r0, &act), &d_down)];
            let (d_act, down_grads) = backward_shared_input(&act, &uses, down.as_ref())?;
            drop((act, down, d_down));
            let (d_gate, d_up) = gated_backward(&gate, &up, &d_act, self.activation)?;
            drop((gate, up, d_act));
            let uses = [
                (&mlp.projs[0], mlp.seed(0, r0, &n2), &d_gate),
                (&mlp.projs[1], mlp.seed(1, r0, &n2), &d_up),
            ];
            let (dn2, gate_up_grads) = backward_shared_input(&n2, &uses, gate_up.as_ref())?;
            drop((n2, d_gate, d_up, gate_up));
            for (sum, grad) in sums.iter_mut().zip(gate_up_grads.into_iter().chain(down_grads)) {
                add_in_f32(sum, grad)?;
            }
            let h1 = h1.narrow(0, r0, len)?;
            d_h1.push(rms_norm_backward_add(
                &h1,
                &self.post_attention_layernorm,
                self.rms_norm_eps,
                &dn2,
                &d_out,
            )?);
        }
        let dtype = d_out.dtype();
        for (p, sum) in [GATE, UP, DOWN].into_iter().zip(sums) {
            grads[p] = sum
                .map(|(a, b)| {
                    Ok::<_, candle_core::Error>(LoraGrad {
                        lora_a: a.to_dtype(dtype)?,
                        lora_b: b.to_dtype(dtype)?,
                    })
                })
                .transpose()?;
        }
        Tensor::cat(&d_h1, 0)
    }
}

/// Rows per tile of an MLP `intermediate` wide when `rows` rows are more than one tile of
/// `tile_values` values holds (the tiles as even as can be), `None` where they fit one (the
/// planner counts the same tiles).
pub fn tile_rows(rows: usize, intermediate: usize, tile_values: usize) -> Option<usize> {
    let max_rows = (tile_values / intermediate.max(1)).max(1);
    (rows > max_rows).then(|| rows.div_ceil(rows.div_ceil(max_rows)))
}

/// sum += grad, in f32.
fn add_in_f32(sum: &mut Option<(Tensor, Tensor)>, grad: Option<LoraGrad>) -> Result<()> {
    let Some(g) = grad else { return Ok(()) };
    let (a, b) = (g.lora_a.to_dtype(DType::F32)?, g.lora_b.to_dtype(DType::F32)?);
    *sum = Some(match sum.take() {
        None => (a, b),
        Some((sa, sb)) => ((sa + a)?, (sb + b)?),
    });
    Ok(())
}

/// One pass's view of the MLP: gate, up and down with their weights dequantized, and the
/// dropout seeds of the whole rows.
struct TiledMlp<'a> {
    layer: &'a DecoderLayer,
    projs: [LoraLinear; 3],
    seeds: [Option<DropoutSeed>; 3],
    dropout: bool,
    n2: &'a Tensor,
    tile_rows: usize,
}

/// One tile's activations.
struct Tile {
    n2: Tensor,
    gate: Tensor,
    up: Tensor,
    act: Tensor,
    gate_up: Option<LoraGroup>,
    down: Option<LoraGroup>,
}

impl<'a> TiledMlp<'a> {
    fn new(layer: &'a DecoderLayer, n2: &'a Tensor, input: &LayerInput) -> Result<Self> {
        let rows = n2.dim(0)?;
        let tile_rows = layer.mlp_tile_rows(rows, input).unwrap_or(rows).max(1);
        let (dtype, dev) = (n2.dtype(), n2.device());
        let projs = section("nf4.dequantize", dev, || {
            Ok::<_, candle_core::Error>([
                layer.proj[GATE].dequantized(dtype, dev)?,
                layer.proj[UP].dequantized(dtype, dev)?,
                layer.proj[DOWN].dequantized(dtype, dev)?,
            ])
        })?;
        let seeds = [seed(input, GATE), seed(input, UP), seed(input, DOWN)];
        Ok(Self { layer, projs, seeds, dropout: input.dropout_seed.is_some(), n2, tile_rows })
    }

    /// (first row, rows) of each tile.
    fn tiles(&self) -> Vec<(usize, usize)> {
        let rows = self.n2.dim(0).unwrap_or(0);
        (0..rows).step_by(self.tile_rows).map(|r0| (r0, self.tile_rows.min(rows - r0))).collect()
    }

    /// Projection i's dropout seed for its input's tile starting at row r0.
    fn seed(&self, i: usize, r0: usize, x: &Tensor) -> Option<DropoutSeed> {
        self.seeds[i].map(|s| s.skip(r0 * x.dim(1).unwrap_or(0)))
    }

    fn project(&self, i: usize, r0: usize, x: &Tensor, group: Option<(&LoraGroup, usize)>) -> Result<Tensor> {
        let mut out = ProductSum::new();
        project_into(&self.projs[i], x, self.seed(i, r0, x), group, &mut out)?;
        out.finish()
    }

    /// gate, up and act of rows r0 .. r0 + len, with the LoRA groups of gate/up and of down.
    fn tile(&self, r0: usize, len: usize) -> Result<Tile> {
        let n2 = self.n2.narrow(0, r0, len)?;
        let gate_up = LoraGroup::forward(&[&self.projs[0], &self.projs[1]], &n2, self.dropout)?;
        let gate = self.project(0, r0, &n2, gate_up.as_ref().map(|g| (g, 0)))?;
        let up = self.project(1, r0, &n2, gate_up.as_ref().map(|g| (g, 1)))?;
        let act = gated(&gate, &up, self.layer.activation)?;
        let down = LoraGroup::forward(&[&self.projs[2]], &act, self.dropout)?;
        Ok(Tile { n2, gate, up, act, gate_up, down })
    }
}
