//! `LoraLinear`: a frozen base weight plus an optional trained low-rank update,
//! y = x Wᵀ + scale · dropout(x) Aᵀ Bᵀ, with a hand-written backward that never computes the
//! frozen weight's gradient.

use candle_core::{DType, Device, Result, Tensor, Var};
use rand::{Rng, SeedableRng};

/// The frozen weight of a projection, `[out, in]`. (4-bit NF4 storage plugs in here.)
#[derive(Debug, Clone)]
pub enum BaseWeight {
    Dense(Tensor),
}

impl BaseWeight {
    pub fn dims(&self) -> (usize, usize) {
        match self {
            BaseWeight::Dense(w) => (w.dim(0).unwrap_or(0), w.dim(1).unwrap_or(0)),
        }
    }

    /// x `[n, in]` → `[n, out]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            BaseWeight::Dense(w) => x.matmul(&w.t()?),
        }
    }

    /// dy `[n, out]` → dx `[n, in]` through the same weight.
    fn backward_input(&self, dy: &Tensor) -> Result<Tensor> {
        match self {
            BaseWeight::Dense(w) => dy.matmul(w),
        }
    }

    /// The weight as a dense tensor (for merging and for the autograd oracle).
    pub fn dense(&self) -> Result<Tensor> {
        match self {
            BaseWeight::Dense(w) => Ok(w.clone()),
        }
    }
}

/// The trained part: `lora_a` `[r, in]`, `lora_b` `[out, r]` (PEFT's shapes), in f32.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    pub lora_a: Var,
    pub lora_b: Var,
    pub scale: f64,
    pub dropout: f64,
}

impl LoraAdapter {
    /// PEFT's init: A ~ kaiming_uniform(a=√5) = U(-1/√in, 1/√in), B = 0, so training starts at
    /// exactly the base model.
    pub fn init(
        r: usize,
        (out_dim, in_dim): (usize, usize),
        scale: f64,
        dropout: f64,
        rng: &mut impl Rng,
        device: &Device,
    ) -> Result<Self> {
        let bound = 1.0 / (in_dim as f32).sqrt();
        let a: Vec<f32> = (0..r * in_dim).map(|_| rng.random_range(-bound..bound)).collect();
        let lora_a = Var::from_tensor(&Tensor::from_vec(a, (r, in_dim), device)?)?;
        let lora_b = Var::zeros((out_dim, r), DType::F32, device)?;
        Ok(Self { lora_a, lora_b, scale, dropout })
    }

    pub fn rank(&self) -> usize {
        self.lora_a.dim(0).unwrap_or(0)
    }

    /// A and B in the compute dtype, detached: the training path has its own backward, and a
    /// tracked `Var` would make candle keep every intermediate of the forward alive.
    fn weights(&self, dtype: DType) -> Result<(Tensor, Tensor)> {
        let a = self.lora_a.as_tensor().detach().to_dtype(dtype)?;
        let b = self.lora_b.as_tensor().detach().to_dtype(dtype)?;
        Ok((a, b))
    }
}

/// Dropout mask for one LoRA input, regenerated from its seed in the backward's recompute so that
/// the forward never has to keep it. Values are 0 or 1/(1-p), as in `torch.nn.Dropout`.
#[derive(Debug, Clone, Copy)]
pub struct DropoutSeed(pub u64);

fn dropout_mask(seed: DropoutSeed, p: f64, shape: (usize, usize), device: &Device) -> Result<Tensor> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed.0);
    let keep = (1.0 / (1.0 - p)) as f32;
    let n = shape.0 * shape.1;
    let mask: Vec<f32> = (0..n).map(|_| if rng.random::<f64>() < p { 0.0 } else { keep }).collect();
    Tensor::from_vec(mask, shape, device)
}

#[derive(Debug, Clone)]
pub struct LoraLinear {
    pub base: BaseWeight,
    pub lora: Option<LoraAdapter>,
}

/// Gradients of one adapter.
pub struct LoraGrad {
    pub lora_a: Tensor,
    pub lora_b: Tensor,
}

impl LoraLinear {
    /// x `[n, in]` → `[n, out]`. `dropout` is `None` in eval mode.
    pub fn forward(&self, x: &Tensor, dropout: Option<DropoutSeed>) -> Result<Tensor> {
        let y = self.base.forward(x)?;
        let Some(lora) = &self.lora else { return Ok(y) };
        let xd = self.dropped_input(x, dropout)?;
        let (a, b) = lora.weights(x.dtype())?;
        let delta = xd.matmul(&a.t()?)?.matmul(&b.t()?)?;
        y + (delta * lora.scale)?
    }

    fn dropped_input(&self, x: &Tensor, dropout: Option<DropoutSeed>) -> Result<Tensor> {
        match (&self.lora, dropout) {
            (Some(l), Some(seed)) if l.dropout > 0.0 => {
                let mask = dropout_mask(seed, l.dropout, x.dims2()?, x.device())?;
                x.mul(&mask.to_dtype(x.dtype())?)
            }
            _ => Ok(x.clone()),
        }
    }

    /// Given the forward's input x and the output gradient dy, returns dx and the adapter's
    /// gradients (f32). The base weight only ever appears as dy·W.
    pub fn backward(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dropout: Option<DropoutSeed>,
    ) -> Result<(Tensor, Option<LoraGrad>)> {
        let dx = self.base.backward_input(dy)?;
        let Some(lora) = &self.lora else { return Ok((dx, None)) };
        let (a, b) = lora.weights(x.dtype())?;
        let mask = match dropout {
            Some(seed) if lora.dropout > 0.0 => {
                Some(dropout_mask(seed, lora.dropout, x.dims2()?, x.device())?.to_dtype(x.dtype())?)
            }
            _ => None,
        };
        let xd = match &mask {
            Some(m) => x.mul(m)?,
            None => x.clone(),
        };
        let h = xd.matmul(&a.t()?)?; // [n, r]
        let grad_b = (dy.t()?.matmul(&h)? * lora.scale)?; // [out, r]
        let dh = (dy.matmul(&b)? * lora.scale)?; // [n, r]
        let grad_a = dh.t()?.matmul(&xd)?; // [r, in]
        let mut dxd = dh.matmul(&a)?; // [n, in]
        if let Some(m) = &mask {
            dxd = dxd.mul(m)?;
        }
        let grad = LoraGrad { lora_a: grad_a.to_dtype(DType::F32)?, lora_b: grad_b.to_dtype(DType::F32)? };
        Ok(((dx + dxd)?, Some(grad)))
    }
}
