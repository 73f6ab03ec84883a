"""Thin ctypes binding of the KLA C ABI (cuda/include/kla/kla.h, KLA_ABI_VERSION 4).

Nothing here compiles against torch: tensors are passed as raw device pointers and element
strides, the stream as the integer handle of torch.cuda.current_stream().cuda_stream.

    lib = KlaLibrary("path/to/libkla_cuda.so.4")  # checks the ABI and struct layout
    p = lib.params()                              # kla_params_init defaults
    ...fill p...
    lib.chunk_forward(p, stream)                  # raises KlaError on a non-zero status

The layout of kla_params is mirrored field by field below. Three checks keep it honest:
  * kla_abi_version() must equal ABI_VERSION (the library refuses params stamped for another
    layout anyway: KLA_ERROR_ABI_MISMATCH);
  * the offsets ctypes computes must equal EXPECTED_OFFSETS (read off kla.h with offsetof on
    x86-64 / LP64), so an edit here that moves a field fails at import;
  * at load, kla_params_init_abi (which memsets sizeof(kla_params) bytes, then sets defaults) runs
    on a buffer with sentinel bytes after our struct: the library must zero exactly our size
    and put eta_value = 1 at our eta_value offset, so a header change that resizes or reorders
    the struct fails before anything is launched.
"""
import ctypes
from ctypes import POINTER, c_char, c_char_p, c_float, c_int, c_int32, c_int64, c_size_t, c_uint32, c_void_p

ABI_VERSION = 4

DTYPE_FP32, DTYPE_BF16, DTYPE_FP16 = 0, 1, 2
COEFF_KACZMARZ, COEFF_GIVEN = 0, 1
READOUT_SCALE, READOUT_Q_L2NORM = 0, 1
FP32_MATH_ACCURATE, FP32_MATH_FAST = 0, 1
PATH_AUTO, PATH_WY, PATH_WY_TRANSPOSED, PATH_TF32, PATH_GENERIC, PATH_TOKENWISE = range(6)
SUCCESS = 0


class KlaParams(ctypes.Structure):
    _fields_ = [
        ("abi_version", c_uint32),
        ("struct_size", c_uint32),
        ("dtype", c_int),
        ("batch", c_int64),
        ("seq_len", c_int64),
        ("num_heads", c_int64),
        ("num_v_heads", c_int64),
        ("head_dim_k", c_int64),
        ("head_dim_v", c_int64),
        ("q", c_void_p),
        ("q_strides", c_int64 * 3),
        ("k", c_void_p),
        ("k_strides", c_int64 * 3),
        ("v", c_void_p),
        ("v_strides", c_int64 * 3),
        ("o", c_void_p),
        ("o_strides", c_int64 * 3),
        ("g", c_void_p),
        ("g_strides", c_int64 * 2),
        ("eta", c_void_p),
        ("eta_strides", c_int64 * 2),
        ("eta_value", c_float),
        ("eps", c_float),
        ("scale", c_float),
        ("coefficient", c_int),
        ("readout", c_int),
        ("initial_state", c_void_p),
        ("final_state", c_void_p),
        ("state_pool", c_void_p),
        ("pool_size", c_int64),
        ("state_indices", c_void_p),
        ("state_indices_host", c_void_p),
        ("cu_seqlens", c_void_p),
        ("cu_seqlens_host", c_void_p),
        ("num_seqs", c_int64),
        ("workspace", c_void_p),
        ("workspace_size", c_size_t),
        ("fp32_math", c_int),
        ("path", c_int),
        ("value_slice", c_int32),
    ]


class KlaPlan(ctypes.Structure):
    _fields_ = [
        ("path", c_int),
        ("path_name", c_char_p),
        ("chunk_len", c_int32),
        ("value_slice", c_int32),
        ("stages", c_int32),
        ("threads", c_int32),
        ("blocks", c_int64),
        ("prep_blocks", c_int64),
        ("smem_bytes", c_int64),
        ("prep_smem_bytes", c_int64),
        ("workspace_bytes", c_size_t),
        ("reason", c_char * 768),
    ]


# offsetof(kla_params, f) and sizeof(kla_params) from kla.h (gcc, x86-64).
EXPECTED_SIZE = 368
EXPECTED_OFFSETS = {
    "abi_version": 0, "struct_size": 4, "dtype": 8, "batch": 16, "seq_len": 24, "num_heads": 32,
    "num_v_heads": 40, "head_dim_k": 48, "head_dim_v": 56, "q": 64, "q_strides": 72, "k": 96,
    "k_strides": 104, "v": 128, "v_strides": 136, "o": 160, "o_strides": 168, "g": 192,
    "g_strides": 200, "eta": 216, "eta_strides": 224, "eta_value": 240, "eps": 244, "scale": 248,
    "coefficient": 252, "readout": 256, "initial_state": 264, "final_state": 272,
    "state_pool": 280, "pool_size": 288, "state_indices": 296, "state_indices_host": 304,
    "cu_seqlens": 312, "cu_seqlens_host": 320, "num_seqs": 328, "workspace": 336,
    "workspace_size": 344, "fp32_math": 352, "path": 356, "value_slice": 360,
}
assert ctypes.sizeof(KlaPlan) == 840, ctypes.sizeof(KlaPlan)

assert ctypes.sizeof(KlaParams) == EXPECTED_SIZE, ctypes.sizeof(KlaParams)
for _name, _off in EXPECTED_OFFSETS.items():
    assert getattr(KlaParams, _name).offset == _off, (_name, getattr(KlaParams, _name).offset, _off)
assert [f[0] for f in KlaParams._fields_] == list(EXPECTED_OFFSETS), "field order"


class KlaError(RuntimeError):
    def __init__(self, status, message):
        super().__init__(f"{status}: {message}")
        self.status = status


class KlaLibrary:
    def __init__(self, path):
        self.path = path
        self.lib = lib = ctypes.CDLL(path)
        lib.kla_params_init_abi.argtypes = [c_void_p, c_uint32, c_uint32]
        lib.kla_params_init_abi.restype = None
        for fn in (lib.kla_chunk_forward, lib.kla_tokenwise_forward):
            fn.argtypes = [POINTER(KlaParams), c_void_p]
            fn.restype = c_int
        lib.kla_validate.argtypes = [POINTER(KlaParams)]
        lib.kla_validate.restype = c_int
        lib.kla_workspace_size.argtypes = [POINTER(KlaParams)]
        lib.kla_workspace_size.restype = c_size_t
        lib.kla_status_string.argtypes = [c_int]
        lib.kla_status_string.restype = c_char_p
        lib.kla_last_error_message.argtypes = []
        lib.kla_last_error_message.restype = c_char_p
        lib.kla_version_string.argtypes = []
        lib.kla_version_string.restype = c_char_p
        lib.kla_abi_version.argtypes = []
        lib.kla_abi_version.restype = c_uint32
        lib.kla_plan_chunk_forward.argtypes = [POINTER(KlaParams), POINTER(KlaPlan)]
        lib.kla_plan_chunk_forward.restype = c_int
        self.version = lib.kla_version_string().decode()
        if lib.kla_abi_version() != ABI_VERSION:
            raise KlaError(-1, f"{path} is ABI {lib.kla_abi_version()}, kla_ctypes.py ABI {ABI_VERSION}")
        self._check_layout()

    def _check_layout(self):
        """kla_params_init_abi must zero exactly sizeof(KlaParams) bytes and set our defaults."""
        size = ctypes.sizeof(KlaParams)
        pad = 64
        buf = (ctypes.c_ubyte * (size + pad))(*([0xA5] * (size + pad)))
        self.lib.kla_params_init_abi(ctypes.addressof(buf), ABI_VERSION, size)
        tail = bytes(buf[size:])
        if tail != bytes([0xA5] * pad):
            raise KlaError(-1, f"kla_params is larger in {self.path} than in kla_ctypes.py ({size})")
        p = KlaParams.from_buffer_copy(bytes(buf[:size]))
        if bytes(buf[size - 8:size]) != bytes(8):  # last field: zeroed by the library's memset
            raise KlaError(-1, f"kla_params is smaller in {self.path} than in kla_ctypes.py")
        if not (p.abi_version == ABI_VERSION and p.struct_size == size
                and p.eta_value == 1.0 and p.eps == 0.0 and p.scale == 0.0 and p.dtype == DTYPE_BF16
                and p.coefficient == COEFF_KACZMARZ and p.readout == READOUT_SCALE and p.batch == 0
                and p.fp32_math == FP32_MATH_ACCURATE and p.path == PATH_AUTO):
            raise KlaError(-1, "kla_params_init defaults are not where kla_ctypes.py expects them")

    def params(self):
        p = KlaParams()
        self.lib.kla_params_init_abi(ctypes.byref(p), ABI_VERSION, ctypes.sizeof(KlaParams))
        return p

    def _check(self, status):
        if status != SUCCESS:
            raise KlaError(self.lib.kla_status_string(status).decode(),
                           self.lib.kla_last_error_message().decode())

    def validate(self, p):
        self._check(self.lib.kla_validate(ctypes.byref(p)))

    def workspace_size(self, p):
        return int(self.lib.kla_workspace_size(ctypes.byref(p)))

    def plan_chunk_forward(self, p):
        """The plan kla_chunk_forward would run (path, tiling, reason) as a dict."""
        plan = KlaPlan()
        self._check(self.lib.kla_plan_chunk_forward(ctypes.byref(p), ctypes.byref(plan)))
        return {"path": plan.path_name.decode(), "value_slice": plan.value_slice,
                "stages": plan.stages, "blocks": plan.blocks, "reason": plan.reason.decode()}

    def chunk_forward(self, p, stream=0):
        self._check(self.lib.kla_chunk_forward(ctypes.byref(p), c_void_p(stream)))

    def tokenwise_forward(self, p, stream=0):
        self._check(self.lib.kla_tokenwise_forward(ctypes.byref(p), c_void_p(stream)))


def torch_dtype_code(dtype):
    import torch
    return {torch.float32: DTYPE_FP32, torch.bfloat16: DTYPE_BF16, torch.float16: DTYPE_FP16}[dtype]


def make_params(lib, q, k, v, o, g=None, eta=None, eps=0.0, scale=0.0, initial_state=None,
                final_state=None, coefficient=COEFF_KACZMARZ, workspace=None,
                fp32_math=FP32_MATH_ACCURATE):
    """kla_params for torch tensors q, k [B,T,H,K], v, o [B,T,HV,V], g, eta [B,T,HV] fp32,
    states [B,HV,K,V] fp32 (contiguous), workspace a uint8 device tensor of at least
    lib.workspace_size(p) bytes (kla_chunk_forward's fast path; None = the slow workspace-free
    kernel), fp32_math the fp32 chunkwise arithmetic (kla.h). Keeps no reference to the tensors:
    the caller must."""
    p = lib.params()
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    p.dtype = torch_dtype_code(q.dtype)
    p.batch, p.seq_len, p.num_heads, p.num_v_heads, p.head_dim_k, p.head_dim_v = B, T, H, HV, K, V
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
        assert t.stride(-1) == 1 and t.is_cuda
        setattr(p, name, t.data_ptr())
        getattr(p, name + "_strides")[:] = list(t.stride()[:3])
    for name, t in (("g", g), ("eta", eta)):
        if t is not None:
            assert t.stride(-1) == 1 and t.dtype.itemsize == 4
            setattr(p, name, t.data_ptr())
            getattr(p, name + "_strides")[:] = list(t.stride()[:2])
    p.eps = float(eps)
    p.scale = float(scale)
    p.coefficient = coefficient
    p.fp32_math = fp32_math
    if initial_state is not None:
        assert initial_state.is_contiguous()
        p.initial_state = initial_state.data_ptr()
    if final_state is not None:
        assert final_state.is_contiguous()
        p.final_state = final_state.data_ptr()
    if workspace is not None:
        p.workspace = workspace.data_ptr()
        p.workspace_size = workspace.numel() * workspace.element_size()
    return p
