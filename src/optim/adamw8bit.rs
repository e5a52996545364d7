//! bitsandbytes' 8-bit AdamW (`bnb.optim.AdamW8bit`: blockwise, `min_8bit_size` 4096,
//! `percentile_clipping` off). A parameter of 4096 elements or more keeps its moments as 8-bit
//! codes (`state1`: first moment, signed dynamic map; `state2`: second moment, unsigned map)
//! with an f32 absmax per block of 256 (`absmax1`, `absmax2`): 2 bytes + 8 bytes/256 per
//! element instead of AdamW's 8. Smaller parameters keep f32 `exp_avg`/`exp_avg_sq` and
//! bitsandbytes' 32-bit Adam step. Unlike torch's AdamW, bitsandbytes applies the weight decay
//! after the update and adds eps·sqrt(1-β2^t) to sqrt(v) (the same step in exact arithmetic,
//! rounded differently). The arithmetic is `blockwise8.rs`; on CUDA one fused launch updates
//! every parameter (`crate::cuda::adamw`), with the state bit for bit as bitsandbytes'.

use std::collections::HashMap;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor, Var};

use super::blockwise8::{self, Hyper, BLOCK, MIN_8BIT_SIZE};
use super::state::{check_counts, grad_for, no_strangers, take};
use crate::config::AdamwSection;
use crate::quant::dynamic::{dynamic_map, unsigned_dynamic_map};

/// One parameter's moments.
#[derive(Debug, Clone)]
enum Moments {
    /// 8-bit codes (u8, one per element) and f32 absmax per block.
    Blockwise { state1: Tensor, state2: Tensor, absmax1: Tensor, absmax2: Tensor },
    /// f32, below `min_8bit_size`.
    Full { exp_avg: Tensor, exp_avg_sq: Tensor },
}

pub struct AdamW8bit {
    params: Vec<Var>,
    moments: Vec<Moments>,
    cfg: AdamwSection,
    weight_decay: f64,
    step: u64,
    /// The signed and unsigned maps (bitsandbytes' `qmap1`, `qmap2`; `quant::dynamic`).
    qmaps: (&'static [f32; 256], &'static [f32; 256]),
    /// Both maps on the GPU, uploaded at the first fused step and kept.
    #[cfg(feature = "cuda")]
    device_maps: Option<crate::cuda::adamw::DeviceMaps>,
}

/// Blocks of 256 of a parameter of `n` elements.
pub fn blocks(n: usize) -> usize {
    n.div_ceil(BLOCK)
}

/// Whether a parameter of `n` elements keeps 8-bit state.
pub fn is_8bit(n: usize) -> bool {
    n >= MIN_8BIT_SIZE
}

fn fresh(p: &Tensor) -> Result<Moments> {
    let (n, dev) = (p.elem_count(), p.device());
    anyhow::ensure!(p.dtype() == DType::F32, "optim: AdamW8bit keeps f32 parameters, got {:?}", p.dtype());
    Ok(if is_8bit(n) {
        // bitsandbytes starts from codes 0 and absmax 0 (every moment 0)
        let codes = || Tensor::zeros(n, DType::U8, dev);
        let absmax = || Tensor::zeros(blocks(n), DType::F32, dev);
        Moments::Blockwise { state1: codes()?, state2: codes()?, absmax1: absmax()?, absmax2: absmax()? }
    } else {
        Moments::Full { exp_avg: p.zeros_like()?.flatten_all()?, exp_avg_sq: p.zeros_like()?.flatten_all()? }
    })
}

impl AdamW8bit {
    /// `weight_decay` is `train.weight_decay`.
    pub fn new(params: Vec<Var>, cfg: &AdamwSection, weight_decay: f64) -> Result<Self> {
        let moments = params.iter().map(|p| fresh(p.as_tensor())).collect::<Result<Vec<_>>>()?;
        let qmaps = (dynamic_map(), unsigned_dynamic_map());
        Ok(Self {
            params,
            moments,
            cfg: *cfg,
            weight_decay,
            step: 0,
            qmaps,
            #[cfg(feature = "cuda")]
            device_maps: None,
        })
    }

    pub fn step_count(&self) -> u64 {
        self.step
    }

    pub fn params(&self) -> &[Var] {
        &self.params
    }

    fn hyper(&self, lr: f64, grad_mult: f64) -> Hyper {
        let c = &self.cfg;
        Hyper::new(c.beta1, c.beta2, c.eps, lr, self.weight_decay, grad_mult, self.step)
    }

    /// One step on `grads[i] · grad_mult`; `lr` is this step's lr. On CUDA one fused launch
    /// (parameters and state that do not fit it are an error, never a silent round trip through
    /// host memory); on the CPU `blockwise8`'s element loops.
    pub fn step_scaled(&mut self, grads: &[Tensor], grad_mult: f64, lr: f64) -> Result<()> {
        check_counts(grads.len(), self.params.len())?;
        #[cfg(feature = "cuda")]
        if self.params.iter().any(|p| p.device().is_cuda()) {
            anyhow::ensure!(
                self.fused_fits(grads),
                "optim: AdamW8bit's fused CUDA step takes contiguous f32 parameters and state on the \
                 GPU and contiguous gradients of one dtype shaped as their parameters; got parameters \
                 {:?} and gradients {:?}",
                self.params.first().map(|p| (p.dtype(), p.device().location())),
                grads.first().map(|g| (g.dtype(), g.device().location(), g.is_contiguous()))
            );
            self.step += 1;
            let h = self.hyper(lr, grad_mult);
            return self.fused_step(grads, &h);
        }
        self.step += 1;
        let h = self.hyper(lr, grad_mult);
        for (i, grad) in grads.iter().enumerate() {
            let g = grad_for(&self.params[i], grad, i)?;
            self.step_one(i, &g, &h).with_context(|| format!("optim: AdamW8bit, parameter {i}"))?;
        }
        Ok(())
    }

    /// `step_scaled` with `grad_mult` 1.
    pub fn step(&mut self, grads: &[Tensor], lr: f64) -> Result<()> {
        self.step_scaled(grads, 1.0, lr)
    }

    fn step_one(&mut self, i: usize, g: &Tensor, h: &Hyper) -> Result<()> {
        let var = &self.params[i];
        let dev = var.device().clone();
        let host = |t: &Tensor| -> Result<Tensor> { Ok(t.to_device(&Device::Cpu)?.flatten_all()?) };
        let mut p: Vec<f32> = host(var.as_tensor())?.to_vec1()?;
        let g: Vec<f32> = host(g)?.to_vec1()?;
        let n = p.len();
        let back = |v: Vec<f32>| -> Result<Tensor> { Ok(Tensor::from_vec(v, n, &dev)?) };
        match &mut self.moments[i] {
            Moments::Blockwise { state1, state2, absmax1, absmax2 } => {
                let mut c1: Vec<u8> = host(state1)?.to_vec1()?;
                let mut c2: Vec<u8> = host(state2)?.to_vec1()?;
                let mut a1: Vec<f32> = host(absmax1)?.to_vec1()?;
                let mut a2: Vec<f32> = host(absmax2)?.to_vec1()?;
                for b in 0..a1.len() {
                    let r = b * BLOCK..((b + 1) * BLOCK).min(p.len());
                    blockwise8::update_block(
                        &mut p[r.clone()],
                        &g[r.clone()],
                        &mut c1[r.clone()],
                        &mut c2[r],
                        &mut a1[b],
                        &mut a2[b],
                        self.qmaps,
                        h,
                    );
                }
                *state1 = Tensor::from_vec(c1, n, &dev)?;
                *state2 = Tensor::from_vec(c2, n, &dev)?;
                let blocks = a1.len();
                *absmax1 = Tensor::from_vec(a1, blocks, &dev)?;
                *absmax2 = Tensor::from_vec(a2, blocks, &dev)?;
            }
            Moments::Full { exp_avg, exp_avg_sq } => {
                let mut m: Vec<f32> = host(exp_avg)?.to_vec1()?;
                let mut v: Vec<f32> = host(exp_avg_sq)?.to_vec1()?;
                blockwise8::update_full(&mut p, &g, &mut m, &mut v, h);
                *exp_avg = back(m)?;
                *exp_avg_sq = back(v)?;
            }
        }
        var.set(&Tensor::from_vec(p, var.shape(), &dev)?)?;
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn fused_fits(&self, grads: &[Tensor]) -> bool {
        use crate::cuda::adafactor::{fits, fits_grads};
        let codes_fit = |t: &Tensor| t.is_contiguous() && matches!(t.device(), Device::Cuda(_));
        grads.len() == self.params.len()
            && fits_grads(grads.iter())
            && self.params.iter().zip(grads).all(|(p, g)| fits(p.as_tensor()) && g.dims() == p.dims())
            && self.moments.iter().all(|m| match m {
                Moments::Blockwise { state1, state2, absmax1, absmax2 } => {
                    codes_fit(state1) && codes_fit(state2) && fits(absmax1) && fits(absmax2)
                }
                Moments::Full { exp_avg, exp_avg_sq } => fits(exp_avg) && fits(exp_avg_sq),
            })
    }

    #[cfg(feature = "cuda")]
    fn fused_step(&mut self, grads: &[Tensor], h: &Hyper) -> Result<()> {
        use crate::cuda::adamw::{adamw8bit_step, Adam8Hyper, DeviceMaps, Param8};
        let params: Vec<Param8> = self
            .params
            .iter()
            .zip(grads)
            .zip(&self.moments)
            .map(|((p, g), m)| match m {
                Moments::Blockwise { state1, state2, absmax1, absmax2 } => {
                    Param8::Blockwise { p: p.as_tensor(), g, state1, state2, absmax1, absmax2 }
                }
                Moments::Full { exp_avg, exp_avg_sq } => {
                    Param8::Full { p: p.as_tensor(), g, exp_avg, exp_avg_sq }
                }
            })
            .collect();
        let k = Adam8Hyper {
            beta1: h.beta1,
            beta2: h.beta2,
            eps: h.eps,
            lr: h.lr,
            weight_decay: h.weight_decay,
            grad_mult: h.grad_mult,
            step: self.step as i32,
        };
        let maps = match self.device_maps.take() {
            Some(maps) => maps,
            None => {
                let values: Vec<f32> = self.qmaps.0.iter().chain(self.qmaps.1.iter()).copied().collect();
                let dev = crate::cuda::cuda_device(self.params[0].as_tensor())?;
                DeviceMaps::new(&dev, &values).context("optim: uploading AdamW8bit's maps")?
            }
        };
        let done = adamw8bit_step(&params, &k, &maps).context("optim: fused AdamW8bit step");
        self.device_maps = Some(maps);
        done
    }

    /// The state to checkpoint: `param.<i>.state1|state2` (u8 codes) and `absmax1|absmax2`, or
    /// `param.<i>.exp_avg|exp_avg_sq` below `min_8bit_size`. They share the live state's memory:
    /// write them before the next step.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (i, m) in self.moments.iter().enumerate() {
            match m {
                Moments::Blockwise { state1, state2, absmax1, absmax2 } => {
                    for (name, t) in
                        [("state1", state1), ("state2", state2), ("absmax1", absmax1), ("absmax2", absmax2)]
                    {
                        out.push((format!("param.{i}.{name}"), t.clone()));
                    }
                }
                Moments::Full { exp_avg, exp_avg_sq } => {
                    out.push((format!("param.{i}.exp_avg"), exp_avg.clone()));
                    out.push((format!("param.{i}.exp_avg_sq"), exp_avg_sq.clone()));
                }
            }
        }
        out
    }

    /// Restores the state of `state_tensors` after `step` steps; all or nothing.
    pub fn load_state(&mut self, tensors: &HashMap<String, Tensor>, step: u64) -> Result<()> {
        no_strangers(tensors, &self.state_tensors(), "AdamW8bit")?;
        let mut loaded = Vec::with_capacity(self.moments.len());
        for (i, m) in self.moments.iter().enumerate() {
            let get = |name: &str, like: &Tensor| take(tensors, &format!("param.{i}.{name}"), like);
            loaded.push(match m {
                Moments::Blockwise { state1, state2, absmax1, absmax2 } => Moments::Blockwise {
                    state1: get("state1", state1)?,
                    state2: get("state2", state2)?,
                    absmax1: get("absmax1", absmax1)?,
                    absmax2: get("absmax2", absmax2)?,
                },
                Moments::Full { exp_avg, exp_avg_sq } => Moments::Full {
                    exp_avg: get("exp_avg", exp_avg)?,
                    exp_avg_sq: get("exp_avg_sq", exp_avg_sq)?,
                },
            });
        }
        (self.moments, self.step) = (loaded, step);
        Ok(())
    }
}

#[cfg(test)]
#[path = "adamw8bit_tests.rs"]
pub(super) mod tests;
