"""Fixtures of the kla package tests (tests/python; docs/python.md, 'Testing').

The CPU tests need no GPU: the library (libkla_cuda, installed in the package) validates and plans
without one, and `launched` replaces the one GPU step, the entry point's call, by a recorder that
keeps what the ops pass (the kla_params struct, validated by the library) instead of launching.
"""
import ctypes
import os

import pytest
import torch

import kla
from kla import _lib, ops
from kla import _params as P

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture
def lib():
    try:
        return _lib.load()
    except kla.KlaLibraryError as e:
        pytest.skip(f"no usable libkla_cuda in this kla package: {e}")


@pytest.fixture
def saving_lib(lib):
    """The library, where it has the saved-states entry points (kla.h "Saved states")."""
    if lib.missing:
        pytest.skip(f"{lib.path} has no {', '.join(lib.missing)} (an ABI 5 library built before "
                    f"saved states): rebuild it to run this test")
    return lib


class Launched:
    """What the ops passed to the entry points: one (entry name, params dict) per call, and in
    `extra` the arguments between the params and the stream (the saving entry points' saved
    states: address and size)."""

    def __init__(self, lib):
        self.lib, self.calls, self.extra = lib, [], []
        self.write_final = None  # a tensor the fake kernel copies into final_state

    def __call__(self, entry, ref, dev, *extra):
        p = ref._obj
        name = entry.__name__
        self.extra.append((name, extra))
        if isinstance(p, P.KlaBackwardParams):  # the kernels' backward (chunk_bwd_saved)
            self.lib.check(self.lib.cdll.kla_validate_backward(ref))
            self.calls.append((name, P.as_dict(p.forward)))
            return 0
        self.lib.validate(p)  # raises KlaError as the real call would
        if name in ("kla_chunk_forward", "kla_chunk_forward_saving"):
            self.plan = self.lib.plan_chunk(p, kla.H100._c())  # needs no GPU
        self.calls.append((name, P.as_dict(p)))
        self.memory = self._snapshot(p)
        if self.write_final is not None and p.final_state:
            src = self.write_final.contiguous()
            ctypes.memmove(p.final_state, src.data_ptr(), src.numel() * 4)
        return 0

    @property
    def params(self):
        return self.calls[-1][1]

    @staticmethod
    def _snapshot(p):
        """The bytes the call's pointers reach (temporaries are freed once the call returns)."""
        elem = 4 if p.dtype == P.DTYPE_FP32 else 2
        n = p.num_seqs if p.cu_seqlens_host else p.batch
        state = n * p.num_v_heads * p.head_dim_k * p.head_dim_v * 4
        span = {
            "q": _span(p.q_strides, (p.batch, p.seq_len, p.num_heads), p.head_dim_k) * elem,
            "k": _span(p.k_strides, (p.batch, p.seq_len, p.num_heads), p.head_dim_k) * elem,
            "g": _span(p.g_strides, (p.batch, p.seq_len), p.num_v_heads) * 4,
            "eta": _span(p.eta_strides, (p.batch, p.seq_len), p.num_v_heads) * 4,
            "initial_state": state, "final_state": state,
            "cu_seqlens_host": (p.num_seqs + 1) * 4, "state_indices_host": n * 4,
        }
        return {f: ctypes.string_at(getattr(p, f), size) for f, size in span.items()
                if getattr(p, f)}

    def mem(self, field, dtype, shape=None):
        """The snapshot of what `field` pointed to, as a tensor of `dtype` (and `shape`)."""
        t = torch.frombuffer(bytearray(self.memory[field]), dtype=dtype)
        return t if shape is None else t[:torch.Size(shape).numel()].view(shape)


def _span(strides, extents, inner):
    return sum((e - 1) * s for s, e in zip(strides, extents)) + inner


@pytest.fixture
def launched(lib, monkeypatch):
    """Kernel calls on CPU tensors: validated and recorded by the library, not launched."""
    rec = Launched(lib)
    monkeypatch.setattr(ops, "_require_cuda", lambda dev: None)
    monkeypatch.setattr(ops, "_call", rec)
    return rec

