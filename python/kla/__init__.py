"""kla: Kaczmarz Linear Attention kernels (libkla_cuda) as PyTorch ops, shaped like
flash-linear-attention's, so that FLA code switches by changing the import (docs/python.md).

    from kla import chunk_kla, fused_recurrent_kla                      # KLA
    from kla import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule   # plain GDN
    kla.nn.KLA(hidden_size=..., head_dim=..., num_heads=...)             # a layer (FLA's arguments)
    kla.torch_impl.chunk_kla(...)                                        # the same math in PyTorch

Importing kla loads no library and needs no GPU; the first kernel call (or kla.plan,
kla.library_info) loads libkla_cuda.so.5 and checks its ABI.
"""
from . import ops  # noqa: F401  (registers torch.ops.kla.*)
from . import cp, nn, torch_impl  # noqa: F401  (kla.cp, kla.nn.KLA, kla.torch_impl.chunk_kla)
from ._lib import KlaError, KlaLibraryError, is_available
from ._params import ABI_VERSION
from ._plan import (A100, H100, H200, BackwardPlan, DeviceInfo, Plan, backward_plan,
                    device_info, plan)
from .api import (chunk_gated_delta_rule, chunk_gdn, chunk_kla, fused_recurrent_gated_delta_rule,
                  fused_recurrent_gdn, fused_recurrent_kla)

__version__ = "0.2.0"

__all__ = [
    "chunk_kla", "fused_recurrent_kla", "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule", "chunk_gdn", "fused_recurrent_gdn", "plan", "Plan",
    "backward_plan", "BackwardPlan", "DeviceInfo", "H100", "H200", "A100", "device_info", "KlaError", "KlaLibraryError",
    "is_available", "library_info", "ABI_VERSION", "__version__",
]


def library_info():
    """What the package loads and how it was built: path, version, ABI, build details. Raises
    KlaLibraryError where the library cannot be used (the message says why)."""
    from . import _lib
    lib = _lib.load()
    return {"path": lib.path, "version": lib.version, "abi_version": ABI_VERSION,
            "build": _lib._build_info()}
