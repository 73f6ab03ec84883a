"""The raw C ABI for benchmarks and experts: kla_params filled by hand, no torch ops around it.

What bench/side_by_side.py uses (KlaLibrary, make_params, the constants), backed by the
package's checked binding (_lib.py, _params.py):

    import kla.lowlevel as kc
    lib = kc.KlaLibrary()            # the package's library (or KlaLibrary(path) for another)
    p = kc.make_params(lib, q, k, v, o, g, eta, eps=1e-6, final_state=h, workspace=ws)
    lib.chunk_forward(p, torch.cuda.current_stream().cuda_stream)
"""
import ctypes

from . import _lib
from ._lib import KlaError, KlaLibraryError  # noqa: F401
from ._params import (ABI_VERSION, COEFF_GIVEN, COEFF_KACZMARZ, DTYPE_BF16,  # noqa: F401
                      DTYPE_FP16, DTYPE_FP32, ARITHMETIC_ACCURATE, ARITHMETIC_FAST,
                      ARITHMETIC_NAMES, PATH_AUTO,
                      PATH_GENERIC, PATH_TF32, PATH_TOKENWISE, PATH_WY, PATH_WY_TRANSPOSED,
                      READOUT_Q_L2NORM, READOUT_SCALE, KlaDeviceInfo, KlaParams, KlaPlan,
                      as_dict, dtype_code, fill)

SUCCESS = 0
torch_dtype_code = dtype_code


class KlaLibrary:
    """libkla_cuda's entry points on raw params; raises KlaError on a non-zero status."""

    def __init__(self, path=None):
        self._lib = _lib.load() if path is None else _lib.Library(path)
        self.path, self.version, self.lib = self._lib.path, self._lib.version, self._lib.cdll

    def params(self):
        return self._lib.params()

    def validate(self, p):
        self._lib.validate(p)

    def workspace_size(self, p):
        return int(self._lib.workspace_size(ctypes.byref(p)))

    def plan_chunk_forward(self, p):
        plan = self._lib.plan_chunk(p)
        return {"path": plan.path_name.decode(), "value_slice": plan.value_slice,
                "stages": plan.stages, "blocks": plan.blocks,
                "arithmetic": ARITHMETIC_NAMES[plan.arithmetic],
                "reason": plan.reason.decode()}

    def chunk_forward(self, p, stream=0):
        self._lib.check(self._lib.chunk_forward(ctypes.byref(p), stream))

    def tokenwise_forward(self, p, stream=0):
        self._lib.check(self._lib.tokenwise_forward(ctypes.byref(p), stream))


def make_params(lib, q, k, v, o, g=None, eta=None, eps=0.0, scale=0.0, initial_state=None,
                final_state=None, coefficient=COEFF_KACZMARZ, workspace=None,
                arithmetic=ARITHMETIC_ACCURATE, **kw):
    """kla_params for torch tensors (more fields in **kw as _params.fill takes them). Keeps no
    reference to the tensors: the caller must."""
    return fill(lib.params(), q, k, v, o, g=g, eta=eta, eps=eps, scale=scale,
                initial_state=initial_state, final_state=final_state, coefficient=coefficient,
                workspace=workspace, arithmetic=arithmetic, **kw)
