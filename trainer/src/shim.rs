//! The error convention of the trainer's C++ shim (`trainer/csrc`): a fallible function
//! returns null on success or a `malloc`ed, NUL-terminated message (the first line of the C++
//! exception), which is read and freed here, exactly once. Used by the collective layer
//! (`dist::ffi`) and by `kernels`.

use std::ffi::{CStr, c_char};

unsafe extern "C" {
    fn rc10d_free_error(err: *mut c_char);
}

/// `Ok` for null; else the shim's message, its memory freed.
///
/// # Safety
/// `err` is null or a message a shim function just returned, which nothing else reads or frees.
pub(crate) unsafe fn take_error(err: *mut c_char) -> Result<(), String> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: per the contract, a NUL-terminated string the shim `malloc`ed; read once, here.
    let msg = unsafe { CStr::from_ptr(err) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: as above; `err` is not used after this.
    unsafe { rc10d_free_error(err) };
    Err(msg)
}
