"""Reading ggml's memory from compiled code: the fields of ``struct ggml_tensor``, pointers of
each element type, calls into ggml and into the hook's Python functions through their addresses,
and node names, for the graph callback (:mod:`kvinject.engine.callback.graph_callback`)."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from .. import ggml

_TYPE, _BUFFER, _NE, _OP, _SRC, _VIEW_SRC, _DATA, _NAME = (
    getattr(ggml.GgmlTensor, f).offset for f in ("type", "buffer", "ne", "op", "src", "view_src", "data", "name")
)


def _pointer_to(element: types.Type):
    @intrinsic
    def pointer(typingctx, address):
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

        return types.CPointer(element)(types.int64), codegen

    return pointer


_i64, _u64, _i32, _u32, _u8, _f32, _f64 = (
    _pointer_to(t) for t in (types.int64, types.uint64, types.int32, types.uint32, types.uint8, types.float32, types.float64)
)


@intrinsic
def _ggml_test(typingctx, function, pointer):
    """A ggml ``bool f(pointer)`` (ggml_is_contiguous, ggml_backend_buffer_is_host), called
    through its address."""

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(8), [ir.IntType(64)])
        return builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [args[1]])

    return types.uint8(types.int64, types.int64), codegen


def _call_void(context, builder, signature, args):
    """Call ``void f(int64, ...)`` through the address in ``args[0]``."""
    fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64)] * (len(args) - 1))
    builder.call(builder.inttoptr(args[0], fnty.as_pointer()), list(args[1:]))
    return context.get_dummy_value()


@intrinsic
def _python_apply(typingctx, function, n):
    """The hook's Python fallback for the first ``n`` (tensor, site, at) triples of its queue,
    called through its ctypes address."""
    return types.void(types.int64, types.int64), _call_void


@intrinsic
def _python_written(typingctx, function, tensor):
    """The hook's Python function for a computed cache write ``tensor``, called through its ctypes address."""
    return types.void(types.int64, types.int64), _call_void


@intrinsic
def _tensor_get(typingctx, function, tensor, data, offset, size):
    """ggml_backend_tensor_get, host or device memory alike."""
    return types.void(types.int64, types.int64, types.int64, types.int64, types.int64), _call_void


def _call_returning(width: int):
    """Codegen of ``f(int64)`` through the address in ``args[0]``, its ``width``-bit result widened to int64."""

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(width), [ir.IntType(64)])
        result = builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [args[1]])
        return result if width == 64 else builder.sext(result, ir.IntType(64))

    return codegen


@intrinsic
def _synchronize(typingctx, function, stream):
    """cuStreamSynchronize(stream) through its address: the CUresult."""
    return types.int64(types.int64, types.int64), _call_returning(32)


@intrinsic
def _buffer_name(typingctx, function, buffer):
    """ggml_backend_buffer_name(buffer) through its address: the name's address."""
    return types.int64(types.int64, types.int64), _call_returning(64)


@intrinsic
def _launch(typingctx, function, kernel, blocks, threads, stream, params):
    """cuLaunchKernel(kernel, blocks, 1, 1, threads, 1, 1, 0, stream, params, NULL) through its
    address: the CUresult."""

    def codegen(context, builder, signature, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        fnty = ir.FunctionType(i32, [i64, i32, i32, i32, i32, i32, i32, i32, i64, i64, i64])
        fn, kernel, blocks, threads, stream, params = args
        one, zero = ir.Constant(i32, 1), ir.Constant(i32, 0)
        grid_and_block = [builder.trunc(blocks, i32), one, one, builder.trunc(threads, i32), one, one]
        result = builder.call(builder.inttoptr(fn, fnty.as_pointer()), [kernel, *grid_and_block, zero, stream, params, ir.Constant(i64, 0)])
        return builder.sext(result, i64)

    return types.int64(*[types.int64] * 6), codegen


@njit(cache=True)
def _layer(name, start):
    """The layer number a node name ends with, from ``start`` to its NUL, or -1."""
    layer = 0
    for i in range(start, 16):
        c = name[i]
        if c == 0:
            return layer if i > start else -1
        if c < 48 or c > 57:
            return -1
        layer = layer * 10 + (c - 48)
    return -1


@njit(cache=True)
def _has_prefix(t, prefix):
    name = carray(_u8(t + _NAME), 16)
    for i in range(len(prefix)):
        if name[i] != prefix[i]:
            return False
    return True


# llama.cpp names each layer's attention weights (flash attention off) 'kq_soft_max-<il>' (llama-graph.cpp, build_attn_mha).
_SOFT_MAX = np.frombuffer(b"kq_soft_max-", np.uint8)


@njit(cache=True)
def _is_soft_max(t):
    return _has_prefix(t, _SOFT_MAX)


# llama.cpp's model graphs name each layer's query 'Qcur-<il>', before RoPE and after: RoPE's input is Q before it.
_QCUR = np.frombuffer(b"Qcur-", np.uint8)


@njit(cache=True)
def _q_rope_layer(t):
    """The layer of a RoPE node named 'Qcur-<il>', or -1."""
    if carray(_i32(t + _OP), 1)[0] != ggml.GGML_OP_ROPE or not _has_prefix(t, _QCUR):
        return -1
    return _layer(carray(_u8(t + _NAME), 16), len(_QCUR))


# llama.cpp's model graphs name each layer's output, the residual stream after attention and FFN, 'l_out-<il>'.
_L_OUT = np.frombuffer(b"l_out-", np.uint8)


@njit(cache=True)
def _l_out_layer(t):
    """The layer of an 'l_out-<il>' node, or -1."""
    return _layer(carray(_u8(t + _NAME), 16), len(_L_OUT)) if _has_prefix(t, _L_OUT) else -1


# llama.cpp names each layer's attention logits, K·Q before the soft max, 'kq-<il>' (llama-graph.cpp, build_attn_mha).
_KQ = np.frombuffer(b"kq-", np.uint8)
