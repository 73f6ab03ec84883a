"""The package itself (CPU): import, version, the library's ABI and layout checks."""
import ctypes
import os
import re

import pytest
import torch

import kla
from kla import _lib
from kla import _params as P
from conftest import REPO


def test_import_needs_no_gpu_and_loads_nothing():
    assert kla.__version__ == "0.2.0"
    for name in ("chunk_kla", "fused_recurrent_kla", "chunk_gated_delta_rule",
                 "fused_recurrent_gated_delta_rule", "plan", "KlaError"):
        assert hasattr(kla, name)
    assert issubclass(kla.KlaError, RuntimeError)
    assert hasattr(torch.ops.kla, "chunk_fwd") and hasattr(torch.ops.kla, "recurrent_fwd_inplace")


def test_abi_version_is_kla_h():
    with open(os.path.join(REPO, "cuda", "include", "kla", "kla.h")) as f:
        m = re.search(r"^#define KLA_ABI_VERSION (\d+)$", f.read(), re.M)
    assert int(m.group(1)) == P.ABI_VERSION == kla.ABI_VERSION


def test_pyproject_version_is_the_project_version():
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        cm = re.search(r"project\(kla VERSION (\S+)", f.read()).group(1)
    with open(os.path.join(REPO, "pyproject.toml")) as f:
        pp = re.search(r'^version = "(.+)"', f.read(), re.M).group(1)
    assert cm == pp == kla.__version__


def test_library_loads_and_matches(lib):
    info = kla.library_info()
    assert info["version"] == kla.__version__ and info["abi_version"] == P.ABI_VERSION
    assert os.path.basename(info["path"]) == f"libkla_cuda.so.{P.ABI_VERSION}"
    assert lib.cdll.kla_abi_version() == P.ABI_VERSION
    p = lib.params()
    assert (p.abi_version, p.struct_size, p.eta_value, p.path) == (P.ABI_VERSION, 368, 1.0, 0)


def test_another_abi_is_refused(lib):
    mine, other = P.ABI_VERSION, P.ABI_VERSION + 1
    with pytest.raises(kla.KlaLibraryError, match=rf"is ABI {mine} .*expects ABI {other}"):
        _lib.Library(lib.path, abi_version=other)


class _FakeCDLL:
    """A library object whose kla_abi_version / kla_params_init_abi misbehave on purpose."""

    def __init__(self, abi=P.ABI_VERSION, extra=0, short=0, backward_size=None):
        self.abi, self.extra, self.short = abi, extra, short
        outer = self

        def fn(res):
            f = lambda *a: res(*a)  # noqa: E731
            return f

        self.kla_version_string = fn(lambda: b"0.2.0")
        self.kla_abi_version = fn(lambda: outer.abi)

        def init(addr, abi, size):  # writes `size + extra - short` bytes like a memset
            n = size + outer.extra - outer.short
            ctypes.memset(addr, 0, n)
            p = P.KlaParams.from_address(addr)
            p.abi_version, p.struct_size, p.eta_value, p.dtype = abi, size, 1.0, P.DTYPE_BF16
            if outer.short:
                ctypes.memset(addr + n, 0xA5, outer.short)
        self.kla_params_init_abi = fn(init)

        def init_backward(addr, abi, size):  # kla_backward_params_init_abi, this package's layout
            ctypes.memset(addr, 0, size)
            bp = P.KlaBackwardParams.from_address(addr)
            bp.abi_version = abi
            bp.struct_size = size if backward_size is None else backward_size
            init(addr + P.KlaBackwardParams.forward.offset, abi, ctypes.sizeof(P.KlaParams))
        self.kla_backward_params_init_abi = fn(init_backward)

    def __getattr__(self, name):  # every other entry point: present, never called
        if name.startswith("kla_"):
            f = lambda *a: 0  # noqa: E731
            setattr(self, name, f)
            return f
        raise AttributeError(name)


@pytest.mark.parametrize("fake,match", [
    (_FakeCDLL(abi=P.ABI_VERSION - 1),
     rf"is ABI {P.ABI_VERSION - 1} .*expects ABI {P.ABI_VERSION}"),
    (_FakeCDLL(extra=8), r"kla_params is larger"),
    (_FakeCDLL(short=8), r"kla_params is smaller"),
    (_FakeCDLL(backward_size=576), r"kla_backward_params has another layout"),
])
def test_mismatched_library_is_refused(monkeypatch, fake, match):
    monkeypatch.setattr(_lib.ctypes, "CDLL", lambda path: fake)
    monkeypatch.setattr(_lib, "_declare", lambda lib: None)
    with pytest.raises(kla.KlaLibraryError, match=match):
        _lib.Library("/fake/libkla_cuda.so.4")


def test_good_fake_passes_the_checks(monkeypatch):
    monkeypatch.setattr(_lib.ctypes, "CDLL", lambda path: _FakeCDLL())
    monkeypatch.setattr(_lib, "_declare", lambda lib: None)
    _lib.Library("/fake/libkla_cuda.so.4")  # the three mismatches above are the checks' doing


def test_package_built_without_cuda(monkeypatch, tmp_path):
    """No library and a build without CUDA: import works, a kernel call says why it cannot."""
    monkeypatch.setenv("KLA_CUDA_LIBRARY", str(tmp_path / "absent.so.4"))
    monkeypatch.setattr(_lib, "_build_info", lambda: {"cuda": False})
    _lib.reset()
    try:
        assert not kla.is_available()
        q = torch.zeros(1, 4, 1, 64)
        with pytest.raises(kla.KlaLibraryError, match="built without CUDA"):
            kla.chunk_kla(q, q, q)
        with pytest.raises(kla.KlaLibraryError, match="built without CUDA"):
            kla.fused_recurrent_gated_delta_rule(q, q, q)
    finally:
        _lib.reset()


def test_missing_library_names_the_file(monkeypatch, tmp_path):
    monkeypatch.setenv("KLA_CUDA_LIBRARY", str(tmp_path / "absent.so.4"))
    monkeypatch.setattr(_lib, "_build_info", lambda: {"cuda": True})
    _lib.reset()
    try:
        with pytest.raises(kla.KlaLibraryError, match="absent.so.4 does not exist"):
            _lib.load()
    finally:
        _lib.reset()


def test_kernel_on_cpu_tensors_says_cuda(lib):
    q = torch.zeros(1, 4, 1, 64)
    with pytest.raises(ValueError, match="CUDA tensors; q is on cpu"):
        kla.chunk_kla(q, q, q)


def test_host_copy_remembered_per_tensor_and_version():
    """kla._indices remembers a host copy for one tensor object at one version: the same unchanged
    tensor gets it back, an in-place change or another tensor of the same values does not, and the
    entry goes with its tensor."""
    import gc

    from kla import _indices

    t = torch.tensor([0, 3, 7], dtype=torch.int32)
    host = t.clone()
    assert _indices.remembered_host(t) is None
    _indices.remember_host(t, host)
    assert _indices.remembered_host(t) is host
    assert _indices.remembered_host(t.clone()) is None
    t.add_(1)
    assert _indices.remembered_host(t) is None
    _indices.remember_host(t, host)
    key = id(t)
    del t
    gc.collect()
    assert key not in _indices._copies
    with torch.inference_mode():
        u = torch.tensor([0, 1], dtype=torch.int32)
    _indices.remember_host(u, u.clone())  # no version counter: nothing remembered
    assert _indices.remembered_host(u) is None

