//! Link fix-ups for libtorch: an rpath to the libtorch directory (binaries and tests run without
//! LD_LIBRARY_PATH), and `libtorch_cuda` linked with `--no-as-needed` when present, so
//! `Cuda::is_available()` is true on a GPU machine (the linker otherwise drops the library,
//! whose symbols nothing references directly: tch-rs issues #980, #907, #329).

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    if std::path::Path::new(&lib).join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-L{lib}");
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
