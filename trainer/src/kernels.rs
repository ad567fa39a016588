//! libtorch kernels that tch does not bind, called through the trainer's C++ shim
//! (`trainer/csrc/kernels.{h,cpp}`, built by `build.rs` beside the c10d shim): the fused AdamW
//! update, `torch._fused_adamw_`, the kernel behind `torch.optim.AdamW(fused=True)` on CPU and
//! CUDA. It reads each gradient once and writes each parameter and moment once, where the same
//! update as tensor expressions takes about ten passes over the elements.

use std::ffi::{c_char, c_void};

use tch::Tensor;

use crate::error::{Result, TrainerError};

unsafe extern "C" {
    fn rtorch_fused_adamw(
        params: *const *mut c_void,
        grads: *const *mut c_void,
        exp_avgs: *const *mut c_void,
        exp_avg_sqs: *const *mut c_void,
        n: usize,
        step: f64,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
    ) -> *mut c_char;
}

/// The hyperparameters of one fused AdamW update.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWUpdate {
    /// 1-based optimizer step (the bias corrections' exponent).
    pub step: u64,
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    /// Decoupled: every parameter of the call is multiplied by `1 - lr * weight_decay`.
    pub weight_decay: f64,
}

/// One parameter of a fused update: all four tensors of one shape, dtype and device.
pub struct AdamWSlot<'a> {
    pub name: &'a str,
    /// Written in place.
    pub param: &'a Tensor,
    /// Read only.
    pub grad: &'a Tensor,
    /// First and second moments, written in place.
    pub m: &'a Tensor,
    pub v: &'a Tensor,
}

/// Apply one AdamW update (PyTorch's rule) to every slot, in place, on the slots' one device.
/// Refused before anything is written when a slot's tensors differ in shape or dtype, or the
/// slots lie on more than one device.
pub fn fused_adamw(slots: &[AdamWSlot<'_>], h: &AdamWUpdate) -> Result<()> {
    let Some(first) = slots.first() else {
        return Ok(());
    };
    let device = first.param.device();
    for s in slots {
        let (shape, kind) = (s.param.size(), s.param.kind());
        for (what, t) in [("gradient", s.grad), ("m", s.m), ("v", s.v)] {
            if t.size() != shape || t.kind() != kind || t.device() != s.param.device() {
                return Err(TrainerError::Config(format!(
                    "fused AdamW: the {what} of `{}` is {:?} {:?} on {:?}; the parameter is \
                     {shape:?} {kind:?} on {:?}",
                    s.name,
                    t.size(),
                    t.kind(),
                    t.device(),
                    s.param.device()
                )));
            }
        }
        if s.param.device() != device {
            return Err(TrainerError::Config(format!(
                "fused AdamW: `{}` is on {:?}, `{}` on {device:?}; one call takes one device",
                s.name,
                s.param.device(),
                first.name
            )));
        }
    }
    let raw = |t: &Tensor| -> *mut c_void { t.as_ptr().cast_mut().cast() };
    let p: Vec<_> = slots.iter().map(|s| raw(s.param)).collect();
    let g: Vec<_> = slots.iter().map(|s| raw(s.grad)).collect();
    let m: Vec<_> = slots.iter().map(|s| raw(s.m)).collect();
    let v: Vec<_> = slots.iter().map(|s| raw(s.v)).collect();
    // SAFETY: the four arrays hold `slots.len()` pointers to live tch tensors (`torch::Tensor*`),
    // borrowed for the call; the shim takes new references to them and keeps none after it
    // returns. Writing through the parameter and moment tensors is what the caller asked for
    // (their storage is not aliased by the gradients: checked shapes, separate tensors).
    let err = unsafe {
        rtorch_fused_adamw(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            slots.len(),
            h.step as f64,
            h.lr,
            h.betas.0,
            h.betas.1,
            h.weight_decay,
            h.eps,
        )
    };
    // SAFETY: `err` is what the shim function just returned, passed here once.
    unsafe { crate::shim::take_error(err) }
        .map_err(|msg| TrainerError::Torch(tch::TchError::Torch(format!("fused AdamW: {msg}"))))
}
