#!/usr/bin/env bash
# Prepare what perf/gpu.sh needs on a CUDA machine that reaches no package registry, in
# .gpu/ (ignored by git; about 12 MB):
#   llama-src.tar.xz  llama.cpp as llama-cpp-python's sdist vendors it, less what a CUDA build of
#                     the library and two tools never reads (docs, vocab files, other backends),
#                     and llama-cpp-python's Python package (its sdist is 77 MB, over what travels)
#   tokenizer.gguf    the default model's tokenizer alone, for test and benchmark models written
#                     there (the model itself, 98 MB, does not travel: see perf/gpu.sh)
#   wheels/           pure-Python packages kvinject needs that a CUDA image may lack
# Run from the repository root with the project's venv active:  bash perf/gpu_payload.sh
set -euo pipefail
out=.gpu
version=$(python -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out/wheels"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude

python -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work"
tar xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
src="$work/llama_cpp_python-$version"
l="$src/vendor/llama.cpp"
rm -rf "$l"/{models,docs,media,examples,tests,benches,pocs,app,scripts,conversion,skills,ci,.github} "$l"/vendor/miniaudio/*.h
for backend in "$l"/ggml/src/ggml-*/; do
    case $(basename "$backend") in ggml-cpu | ggml-cuda) ;; *) rm -rf "$backend" ;; esac
done
find "$l/tools" -mindepth 1 -maxdepth 1 -type d ! -name perplexity ! -name batched-bench -exec rm -rf {} +
# The tools folder adds every tool: keep the two perf/gpu.sh compares against.
printf 'llama_add_compile_flags()\nadd_subdirectory(batched-bench)\nadd_subdirectory(perplexity)\n' >"$l/tools/CMakeLists.txt"
# miniaudio's header is only read by the tts tool; its CMake target stays.
mkdir -p "$work/payload" && mv "$l" "$work/payload/llama.cpp" && mv "$src/llama_cpp" "$work/payload/llama_cpp"
rm -rf "$work/payload/llama_cpp/lib"
tar cJf "$out/llama-src.tar.xz" -C "$work/payload" llama.cpp llama_cpp

python - "$out/tokenizer.gguf" <<'EOF'
import sys
import gguf
from kvinject.engine.model import resolve_model
source = gguf.GGUFReader(resolve_model(None))
writer = gguf.GGUFWriter(sys.argv[1], "llama")
for key, field in source.fields.items():
    if key.startswith("tokenizer."):
        writer.add_key_value(key, field.contents(), field.types[0], field.types[1] if len(field.types) > 1 else None)
writer.write_header_to_file(); writer.write_kv_data_to_file(); writer.close()
EOF

# llama_cpp imports diskcache; gguf-py (in the llama.cpp sources) reads and writes the models.
python -m pip download -q --no-deps --only-binary=:all: -d "$out/wheels" diskcache
du -sh "$out"/*
