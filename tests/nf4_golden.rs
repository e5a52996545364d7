//! NF4 + double quantization against bitsandbytes 0.50.2's CUDA kernels, bit for bit.
//! Golden file: tests/golden/nf4_bnb.safetensors from scripts/golden/nf4_bnb.py on an H100.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use lora_ft::quant::double::{mean_offset, DoubleQuantized};
use lora_ft::quant::{dynamic, nf4, Absmax, Nf4Tensor};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/nf4_bnb.safetensors");

struct Golden {
    tensors: HashMap<String, Tensor>,
    cases: Vec<String>,
}

fn golden() -> Golden {
    let bytes = std::fs::read(GOLDEN).expect("golden file");
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).expect("safetensors header");
    let meta = meta.metadata().clone().expect("golden metadata");
    assert_eq!(meta["device"], "cuda", "the golden values must come from bnb's CUDA kernels");
    let cases: Vec<String> = serde_json::from_str(&meta["cases"]).expect("case list");
    assert_eq!(cases.len(), 15);
    let tensors = candle_core::safetensors::load(GOLDEN, &Device::Cpu).expect("golden tensors");
    Golden { tensors, cases }
}

impl Golden {
    fn get(&self, case: &str, part: &str) -> &Tensor {
        let key = if part.is_empty() { case.to_string() } else { format!("{case}.{part}") };
        self.tensors.get(&key).unwrap_or_else(|| panic!("golden tensor {key}"))
    }
    fn f32s(&self, case: &str, part: &str) -> Vec<f32> {
        self.get(case, part).flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1().unwrap()
    }
    fn bytes(&self, case: &str, part: &str) -> Vec<u8> {
        self.get(case, part).flatten_all().unwrap().to_vec1().unwrap()
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Values as f32 bits; f16 and bf16 widen to f32 exactly, so equal bits mean equal values.
fn tensor_bits(t: &Tensor) -> Vec<u32> {
    bits(&t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap())
}

fn ulp_diff(a: f32, b: f32) -> i64 {
    a.to_bits() as i64 - b.to_bits() as i64
}

#[test]
fn dynamic_map_and_codebook_equal_bnb() {
    let g = golden();
    assert_eq!(bits(dynamic::dynamic_map()), bits(&g.f32s("dynamic_map", "")));
    assert_eq!(bits(&nf4::NF4_CODE), bits(&g.f32s("nf4_code", "")));
}

#[test]
fn packed_codes_and_raw_absmax_equal_bnb() {
    let g = golden();
    for case in &g.cases {
        let q = Nf4Tensor::quantize(g.get(case, "input"), false).unwrap();
        assert_eq!(q.packed().to_vec1::<u8>().unwrap(), g.bytes(case, "packed"), "{case}: packed");
        let Absmax::F32(absmax) = q.absmax() else { panic!("{case}: expected f32 absmax") };
        assert_eq!(bits(&absmax.to_vec1().unwrap()), bits(&g.f32s(case, "absmax")), "{case}: absmax");
    }
}

#[test]
fn double_quant_with_the_golden_offset_equals_bnb() {
    let g = golden();
    for case in &g.cases {
        let offset = g.f32s(case, "offset")[0];
        let dq = DoubleQuantized::compress_with_offset(&g.f32s(case, "absmax"), offset);
        assert_eq!(dq.codes, g.bytes(case, "absmax_codes"), "{case}: absmax codes");
        assert_eq!(bits(&dq.absmax2), bits(&g.f32s(case, "absmax2")), "{case}: absmax2");
    }
}

/// The offset is torch's CUDA mean, whose f32 reduction order we cannot replay; it must match to
/// within one ulp, and the table printed here says which cases are exact.
#[test]
fn offset_is_the_mean_within_one_ulp() {
    let g = golden();
    let mut exact = 0;
    println!("{:<24} {:>6} {:>16} {:>16} {:>4}", "case", "n", "ours", "bnb", "ulp");
    for case in &g.cases {
        let absmax = g.f32s(case, "absmax");
        let (ours, theirs) = (mean_offset(&absmax), g.f32s(case, "offset")[0]);
        let d = ulp_diff(ours, theirs);
        println!("{case:<24} {:>6} {ours:>16.9e} {theirs:>16.9e} {d:>4}", absmax.len());
        assert!(d.abs() <= 1, "{case}: offset {ours} vs {theirs} ({d} ulp)");
        exact += usize::from(d == 0);
    }
    println!("{exact}/{} offsets exact", g.cases.len());
}

/// Quantizes every golden input on `device` and compares every part with bitsandbytes.
fn check_double_quantized_on(device: &Device) {
    let g = golden();
    for case in &g.cases {
        let input = g.get(case, "input").to_device(device).unwrap();
        let q = Nf4Tensor::quantize(&input, true).unwrap();
        assert_eq!(q.shape().dims(), input.dims());
        assert!(q.packed().device().same_device(device), "{case}: parts left the device");
        assert_eq!(q.packed().to_vec1::<u8>().unwrap(), g.bytes(case, "packed"), "{case}: packed");
        let Absmax::Double { codes, absmax2, offset } = q.absmax() else { panic!("{case}: not double") };
        assert_eq!(ulp_diff(*offset, g.f32s(case, "offset")[0]), 0, "{case}: offset");
        assert_eq!(codes.to_vec1::<u8>().unwrap(), g.bytes(case, "absmax_codes"), "{case}: codes");
        assert_eq!(bits(&absmax2.to_vec1().unwrap()), bits(&g.f32s(case, "absmax2")), "{case}: absmax2");
        let deq = q.dequantize(input.dtype()).unwrap();
        assert_eq!((deq.dtype(), deq.dims()), (input.dtype(), input.dims()), "{case}");
        assert_eq!(tensor_bits(&deq), tensor_bits(g.get(case, "dequant")), "{case}: dequant");
        let deq32 = q.dequantize(DType::F32).unwrap();
        assert_eq!(tensor_bits(&deq32), tensor_bits(g.get(case, "dequant_f32")), "{case}: dequant_f32");
        let plain = Nf4Tensor::quantize(&input, false).unwrap();
        assert_eq!(bits(&plain.absmax_f32().unwrap()), bits(&g.f32s(case, "absmax")), "{case}: absmax");
    }
}

#[test]
fn double_quantized_tensor_and_dequantization_equal_bnb() {
    check_double_quantized_on(&Device::Cpu);
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_kernels_equal_bnb() {
    check_double_quantized_on(&Device::new_cuda(0).unwrap());
}

/// The CUDA kernels against the CPU reference on a Mistral-sized weight (58.7M values), f16 and
/// bf16, with and without double quantization, and the dequantization in all three dtypes.
#[cfg(feature = "cuda")]
#[test]
fn cuda_kernels_equal_the_cpu_reference_on_a_large_weight() {
    let gpu = Device::new_cuda(0).unwrap();
    let w = (Tensor::randn(0f32, 0.02, (14336, 4096), &Device::Cpu).unwrap()).to_dtype(DType::F16).unwrap();
    for dtype in [DType::F16, DType::BF16] {
        let w = w.to_dtype(dtype).unwrap();
        for double in [true, false] {
            let cpu = Nf4Tensor::quantize(&w, double).unwrap();
            let cuda = Nf4Tensor::quantize(&w.to_device(&gpu).unwrap(), double).unwrap();
            let (a, b) = (cpu.packed().to_vec1::<u8>().unwrap(), cuda.packed().to_vec1::<u8>().unwrap());
            let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
            assert_eq!(differ, 0, "{dtype:?} double={double}: {differ} of {} packed bytes differ", a.len());
            assert_eq!(bits(&cpu.absmax_f32().unwrap()), bits(&cuda.absmax_f32().unwrap()));
            for out in [DType::F32, DType::F16, DType::BF16] {
                let (x, y) = (cpu.dequantize(out).unwrap(), cuda.dequantize(out).unwrap());
                assert_eq!(tensor_bits(&x), tensor_bits(&y), "{dtype:?} double={double} -> {out:?}");
                // a slice of rows dequantized alone: the same values
                let rows = cuda.dequantize_rows(out, 3584..7168).unwrap();
                let want = x.narrow(0, 3584, 3584).unwrap();
                assert_eq!(
                    tensor_bits(&rows),
                    tensor_bits(&want),
                    "{dtype:?} double={double} rows -> {out:?}"
                );
            }
        }
    }
}

#[test]
fn a_zero_block_dequantizes_to_minus_its_restored_absmax() {
    // bnb quirk kept on purpose: 0 * (1/0) = NaN falls to code 0 (-1.0), not to the 0.0 code
    let g = golden();
    let q = Nf4Tensor::quantize(g.get("zero_blocks_40x64", "input"), true).unwrap();
    let row3 = q.dequantize(DType::F32).unwrap().get(3).unwrap().to_vec1::<f32>().unwrap();
    let absmax = q.absmax_f32().unwrap();
    assert!(row3.iter().all(|&v| v == -absmax[3]), "{row3:?}");
    assert_eq!(g.bytes("zero_blocks_40x64", "packed")[3 * 32..4 * 32], [0u8; 32]);
}
