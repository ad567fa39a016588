# Source me: points tch's build (torch-sys) at the libtorch of the pip wheel `torch==2.11.0` in
# .venv (installed by scripts/python-env.sh). The trainer's build.rs adds an rpath to that
# directory, so built binaries and tests need no LD_LIBRARY_PATH.
_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_VENV="${ORCH_VENV:-$_ROOT/.venv}"
export LIBTORCH_USE_PYTORCH=1
export VIRTUAL_ENV="$_VENV"
export PATH="$_VENV/bin:$PATH"
# TORCH_LIB: the wheel's lib/ (libtorch; libtorch_cuda too in a CUDA build).
TORCH_LIB="$("$_VENV/bin/python" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export TORCH_LIB
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _ROOT _VENV
