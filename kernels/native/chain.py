"""A whole pre-norm decoder in one native call (see decoder_chain.cpp): the layers'
weights, norms, caches and rotary tables laid out once as a plan of pointers, then
one call per step instead of about ten per layer."""

import ctypes

import torch

from kernels.chain_plan import ChainLayer, ChainProjection, ChainShape
from kernels.native.build import NativeOp

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class _Linear(ctypes.Structure):
    _fields_ = [("type", _I), ("packed", _P), ("bias", _P), ("out_features", _I),
                ("in_features", _I)]  # fmt: skip


class _Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", _P), ("post_attention_norm", _P), ("q_norm", _P), ("k_norm", _P),
        ("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear), ("down", _Linear),
        ("key_cache", _P), ("value_cache", _P), ("cos_sin", _P), ("rotary_dim", _I),
        ("sliding_window", _I),
    ]  # fmt: skip


class _Model(ctypes.Structure):
    _fields_ = [
        ("num_layers", _I), ("hidden", _I), ("num_heads", _I), ("num_kv_heads", _I),
        ("head_size", _I), ("block_size", _I), ("is_neox", _I),
        ("eps", _F), ("scale", _F), ("logit_softcap", _F),
        ("layers", ctypes.POINTER(_Layer)), ("final_norm", _P),
    ]  # fmt: skip


class _Step(ctypes.Structure):
    _fields_ = [("positions", _P), ("slot_mapping", _P), ("block_tables", _P), ("seq_lens", _P),
                ("query_start_loc", _P), ("num_seqs", _I), ("table_width", _I),
                ("seconds", _P)]  # fmt: skip


_decoder_chain = NativeOp(
    "decoder_chain", ctypes.POINTER(_Model), ctypes.POINTER(_Step), _P, _I, _P
)


class DecoderChain:
    """The plan over ``layers`` (which it keeps alive) and the call that runs it."""

    def __init__(
        self, shape: ChainShape, layers: list[ChainLayer], final_norm: torch.Tensor
    ) -> None:
        self.dtype = final_norm.dtype
        self._keep: list[torch.Tensor] = [final_norm]
        self._layers = (_Layer * len(layers))(*(self._layer(layer) for layer in layers))
        block_size = layers[0].key_cache.shape[1]
        self._model = _Model(
            len(layers), shape.hidden, shape.num_heads, shape.num_kv_heads, shape.head_size,
            block_size, int(shape.is_neox), shape.eps,
            shape.scale, shape.logit_softcap, self._layers, final_norm.data_ptr(),
        )  # fmt: skip

    def _tensor(self, tensor: torch.Tensor | None) -> int | None:
        if tensor is None:
            return None
        tensor = tensor.to(self.dtype).contiguous()
        self._keep.append(tensor)
        return tensor.data_ptr()

    def _linear(self, projection: ChainProjection) -> _Linear:
        blocks = projection.blocks
        self._keep.append(blocks.data)
        return _Linear(int(blocks.ggml_type), blocks.data.data_ptr(), self._tensor(projection.bias),
                       blocks.out_features, blocks.in_features)  # fmt: skip

    def _layer(self, layer: ChainLayer) -> _Layer:
        for cache in (layer.key_cache, layer.value_cache):
            if not cache.is_contiguous() or cache.dtype != self.dtype:
                raise ValueError("the chain takes contiguous caches of the activations' dtype")
        table = layer.cos_sin
        if table is not None and (table.dtype != torch.float32 or not table.is_contiguous()):
            raise ValueError("rotary tables must be contiguous float32")
        self._keep += [layer.key_cache, layer.value_cache]
        self._keep += [] if table is None else [table]
        return _Layer(
            self._tensor(layer.input_norm), self._tensor(layer.post_attention_norm),
            self._tensor(layer.q_norm), self._tensor(layer.k_norm),
            self._linear(layer.qkv), self._linear(layer.o), self._linear(layer.gate_up),
            self._linear(layer.down), layer.key_cache.data_ptr(), layer.value_cache.data_ptr(),
            None if table is None else table.data_ptr(), 0 if table is None else table.shape[-1],
            layer.sliding_window,
        )  # fmt: skip

    def __call__(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        seconds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The final norm's output for the embedded tokens ``hidden`` [rows, hidden]
        (overwritten); the step's metadata as the runner's buffers hold it. With
        ``seconds`` (float64 [4]), the time of each of ``CHAIN_PARTS`` is added to it."""
        if hidden.dtype != self.dtype or not hidden.is_contiguous():
            raise ValueError(f"the chain takes contiguous {self.dtype} rows")
        given = (positions, slot_mapping, seq_lens, query_start_loc)
        step_tensors = [t.contiguous() for t in given]
        if any(t.dtype != torch.int64 for t in step_tensors):
            raise ValueError("positions, slots, lengths and starts must be int64")
        if seconds is not None and (seconds.dtype != torch.float64 or seconds.numel() != 4):
            raise ValueError("seconds must be a float64 tensor of 4 (CHAIN_PARTS)")
        tables = block_tables.to(torch.int32).contiguous()
        positions, slots, lengths, starts = step_tensors
        step = _Step(positions.data_ptr(), slots.data_ptr(), tables.data_ptr(),
                     lengths.data_ptr(), starts.data_ptr(), tables.shape[0], tables.shape[1],
                     None if seconds is None else seconds.data_ptr())  # fmt: skip
        out = torch.empty_like(hidden)
        _decoder_chain(self.dtype, ctypes.byref(self._model), ctypes.byref(step),
                       hidden.data_ptr(), hidden.shape[0], out.data_ptr())  # fmt: skip
        return out
