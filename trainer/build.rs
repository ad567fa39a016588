//! Build steps for libtorch: the c10d shim (trainer/csrc, C++ compiled with `cc` against the
//! torch wheel's headers: the collective layer of `dist`, and `kernels.cpp`, the libtorch
//! kernels tch does not bind: the fused AdamW update of `kernels`, and `attention.cpp`, its bf16
//! causal attention), an rpath to the libtorch directory
//! (binaries and tests run without LD_LIBRARY_PATH), and `libtorch_cuda` linked with
//! `--no-as-needed` when present, so `Cuda::is_available()` is true on a GPU machine (the linker
//! otherwise drops the library, whose symbols nothing references directly: tch-rs issues #980,
//! #907, #329).
//!
//! The shim needs no gloo headers (the wheel ships none): `csrc/gloo_decl.hpp` declares the few
//! ProcessGroupGloo symbols it calls, all exported by libtorch_cpu. The C++ ABI flag follows
//! `LIBTORCH_CXX11_ABI` (as torch-sys reads it), default 1 (every torch >= 2.7 wheel). With the
//! cargo feature `nccl`, `csrc/nccl_shim.cpp` is built too, against CUDA's and NCCL's headers and
//! linked to libnccl. A CUDA torch wheel brings all three in its `nvidia/` packages beside
//! torch (torch 2.11's PyPI wheel: `nvidia/cu13/include`, `nvidia/nccl/{include,lib}`), so a
//! machine without a GPU or a CUDA toolkit builds it too. `CUDA_HOME` (its `include/`),
//! `NCCL_INCLUDE_DIR` and `NCCL_LIB_DIR` override the search; without them the wheel's
//! directories are tried, then /usr/local/cuda.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=NCCL_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=NCCL_LIB_DIR");
    for f in [
        "c10d_shim.h",
        "c10d_shim.cpp",
        "c10d_types.hpp",
        "gloo_decl.hpp",
        "kernels.h",
        "attention.cpp",
        "kernels.cpp",
        "nccl_shim.cpp",
    ] {
        println!("cargo:rerun-if-changed=csrc/{f}");
    }
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        eprintln!(
            "DEP_TCH_LIBTORCH_LIB is not set (torch-sys did not say where libtorch is): the \
             c10d shim cannot be built"
        );
        std::process::exit(1);
    };
    let lib = PathBuf::from(lib);
    build_shim(&lib);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-L{}", lib.display());
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}

/// Compile the shim into a static library linked into the trainer, against `lib/../include`.
fn build_shim(lib: &Path) {
    let torch = lib.parent().unwrap_or(lib);
    let include = torch.join("include");
    if !include
        .join("torch/csrc/distributed/c10d/Backend.hpp")
        .exists()
    {
        eprintln!(
            "no c10d headers under {}: libtorch without its headers?",
            include.display()
        );
        std::process::exit(1);
    }
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());
    let nccl = std::env::var_os("CARGO_FEATURE_NCCL").is_some();
    let mut b = cc::Build::new();
    b.cpp(true)
        .pic(true)
        .std("c++17")
        .warnings(false)
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .include("csrc")
        .file("csrc/c10d_shim.cpp")
        .file("csrc/kernels.cpp")
        .file("csrc/attention.cpp");
    let cuda = nccl.then(|| {
        let found = CudaDirs::find(torch);
        b.define("RC10D_WITH_NCCL", None)
            .define("USE_C10D_NCCL", None)
            .define("USE_CUDA", None)
            .include(&found.cuda_include)
            .include(&found.nccl_include)
            .file("csrc/nccl_shim.cpp");
        found
    });
    b.compile("trainer_c10d");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    if let Some(cuda) = cuda {
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
        // The shim calls the CUDA runtime (streams, events) and NCCL directly.
        for lib in [&cuda.cudart, &cuda.nccl] {
            lib.link();
        }
    }
}

/// A shared library found on disk: its directory and file name.
struct Lib {
    dir: PathBuf,
    file: String,
}

impl Lib {
    /// `lib{stem}.so` or, as the CUDA wheels ship them, `lib{stem}.so.N`, in the first of
    /// `dirs` that has one. Exits naming the directories when none has.
    fn find(stem: &str, dirs: &[PathBuf]) -> Self {
        let plain = format!("lib{stem}.so");
        for dir in dirs {
            if dir.join(&plain).exists() {
                return Self {
                    dir: dir.clone(),
                    file: plain,
                };
            }
            let versioned = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .find_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    let v = name.strip_prefix(&plain)?.strip_prefix('.')?;
                    v.chars().all(|c| c.is_ascii_digit()).then_some(name)
                });
            if let Some(file) = versioned {
                return Self {
                    dir: dir.clone(),
                    file,
                };
            }
        }
        missing(&format!("{plain}[.N]"), dirs)
    }

    /// Link it by its file name (a versioned one has no `-l` short form), with an rpath.
    fn link(&self) {
        println!("cargo:rustc-link-search=native={}", self.dir.display());
        match self
            .file
            .strip_prefix("lib")
            .and_then(|f| f.strip_suffix(".so"))
        {
            Some(stem) => println!("cargo:rustc-link-lib=dylib={stem}"),
            None => println!("cargo:rustc-link-lib=dylib:+verbatim={}", self.file),
        }
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", self.dir.display());
    }
}

/// Where the `nccl` feature finds CUDA's and NCCL's headers and libraries.
struct CudaDirs {
    cuda_include: PathBuf,
    nccl_include: PathBuf,
    cudart: Lib,
    nccl: Lib,
}

impl CudaDirs {
    /// The environment's directories first, then the CUDA wheel's `nvidia/` packages beside
    /// torch, then /usr/local/cuda. Exits with the paths tried when something is missing.
    fn find(torch: &Path) -> Self {
        let nvidia = torch.join("../nvidia");
        let env = |k: &str| std::env::var_os(k).map(PathBuf::from);
        let home = env("CUDA_HOME").unwrap_or_else(|| PathBuf::from("/usr/local/cuda"));
        // torch 2.11's CUDA 13 wheel keeps the toolkit in one package (its `crt/` and `nv/`
        // headers come from the nvidia-cuda-crt and nvidia-cuda-cccl wheels); the CUDA 12
        // wheels split it, the runtime under cuda_runtime.
        let wheel = ["cu13", "cu12", "cuda_runtime"].map(|p| nvidia.join(p));
        let mut cuda_roots: Vec<PathBuf> = Vec::new();
        if env("CUDA_HOME").is_some() {
            cuda_roots.push(home.clone());
        }
        cuda_roots.extend(wheel);
        cuda_roots.push(home);
        let includes: Vec<PathBuf> = cuda_roots.iter().map(|r| r.join("include")).collect();
        let cuda_include = first_with(&includes, "cuda_runtime_api.h");
        for header in ["crt/host_config.h", "nv/target"] {
            if !cuda_include.join(header).exists() {
                eprintln!(
                    "{} has no {header}: with a CUDA torch wheel, pip install the toolkit's \
                     nvidia-cuda-crt and nvidia-cuda-cccl wheels of the same CUDA version \
                     (scripts/requirements-cuda.txt), or set CUDA_HOME to a CUDA toolkit",
                    cuda_include.display()
                );
                std::process::exit(1);
            }
        }
        let lib_dirs: Vec<PathBuf> = cuda_roots
            .iter()
            .flat_map(|r| [r.join("lib"), r.join("lib64")])
            .collect();
        let cudart = Lib::find("cudart", &lib_dirs);
        let nccl_include = first_with(
            &env("NCCL_INCLUDE_DIR")
                .into_iter()
                .chain([nvidia.join("nccl/include"), cuda_include.clone()])
                .collect::<Vec<_>>(),
            "nccl.h",
        );
        let nccl = Lib::find(
            "nccl",
            &env("NCCL_LIB_DIR")
                .into_iter()
                .chain([nvidia.join("nccl/lib")])
                .chain(lib_dirs)
                .chain([PathBuf::from("/usr/lib/x86_64-linux-gnu")])
                .collect::<Vec<_>>(),
        );
        Self {
            cuda_include,
            nccl_include,
            cudart,
            nccl,
        }
    }
}

/// The first directory of `dirs` holding `file`, or exit naming all of them.
fn first_with(dirs: &[PathBuf], file: &str) -> PathBuf {
    dirs.iter()
        .find(|d| d.join(file).exists())
        .cloned()
        .unwrap_or_else(|| missing(file, dirs))
}

fn missing(file: &str, dirs: &[PathBuf]) -> ! {
    let tried: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    eprintln!(
        "the `nccl` feature needs {file}; not in any of: {} (a CUDA torch wheel brings it; or \
         set CUDA_HOME / NCCL_INCLUDE_DIR / NCCL_LIB_DIR)",
        tried.join(", ")
    );
    std::process::exit(1);
}
