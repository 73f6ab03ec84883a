"""Finding, loading and checking libkla_cuda.so.5, the C library behind the package.

The library is loaded once, at the first call that needs it (importing kla loads nothing). It
is looked for in KLA_CUDA_LIBRARY (an environment variable naming a file, for development) or
else in the package's lib/ folder, where `pip install` puts it. A library of another ABI, or one
whose kla_params has another layout, is refused with KlaLibraryError; so is a package built
without CUDA (no nvcc at build time: the package then has no library at all). The saved-states
entry points (kla_saved_states_size, kla_chunk_forward_saving, kla_chunk_backward_saved) are new
symbols of the same ABI: a library without them loads, and only save_states=True refuses it.
"""
import ctypes
import os
import threading
from ctypes import POINTER, c_char_p, c_int, c_int32, c_size_t, c_uint32, c_void_p

from . import _params as P

LIBRARY_NAME = f"libkla_cuda.so.{P.ABI_VERSION}"


class KlaError(RuntimeError):
    """A kla call returned a non-zero kla_status: .status (int), .status_name, .message."""

    def __init__(self, status, status_name, message):
        super().__init__(f"{status_name}: {message}")
        self.status, self.status_name, self.message = status, status_name, message


class KlaLibraryError(RuntimeError):
    """libkla_cuda cannot be used: missing (a build without CUDA), another ABI or layout."""


def _build_info():
    try:
        from . import _build_info as bi
        return dict(bi.BUILD_INFO)
    except ImportError:  # running from the source tree, not an installed package
        return {"cuda": None, "source_tree": True}


def library_path():
    """The file the package loads: $KLA_CUDA_LIBRARY, else the package's lib/libkla_cuda.so.5."""
    env = os.environ.get("KLA_CUDA_LIBRARY")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", LIBRARY_NAME)


def _declare(lib):
    pp = POINTER(P.KlaParams)
    sig = {
        "kla_params_init_abi": (None, [c_void_p, c_uint32, c_uint32]),
        "kla_validate": (c_int, [pp]),
        "kla_chunk_forward": (c_int, [pp, c_void_p]),
        "kla_tokenwise_forward": (c_int, [pp, c_void_p]),
        "kla_plan_chunk_forward": (c_int, [pp, POINTER(P.KlaPlan)]),
        "kla_plan_chunk_forward_for": (c_int, [pp, POINTER(P.KlaDeviceInfo),
                                               POINTER(P.KlaPlan)]),
        "kla_plan_tokenwise_forward": (c_int, [pp, POINTER(P.KlaPlan)]),
        "kla_device_info_get": (c_int, [c_int, POINTER(P.KlaDeviceInfo)]),
        "kla_workspace_size": (c_size_t, [pp]),
        "kla_status_string": (c_char_p, [c_int]),
        "kla_last_error_message": (c_char_p, []),
        "kla_version_string": (c_char_p, []),
        "kla_abi_version": (c_uint32, []),
        "kla_path_name": (c_char_p, [c_int]),
        "kla_backward_params_init_abi": (None, [c_void_p, c_uint32, c_uint32]),
        "kla_validate_backward": (c_int, [POINTER(P.KlaBackwardParams)]),
        "kla_backward_workspace_size": (c_size_t, [POINTER(P.KlaBackwardParams)]),
        "kla_chunk_backward": (c_int, [POINTER(P.KlaBackwardParams), c_void_p]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


def _declare_saving(lib):
    """The saved-states entry points (kla.h "Saved states"): new in ABI 5, so an ABI 5 library
    built before them still loads; save_states=True then raises (Library._saving_entry).
    Returns the names the library lacks."""
    pp = POINTER(P.KlaParams)
    saving = {
        "kla_saved_states_size": (c_size_t, [pp]),
        "kla_chunk_forward_saving": (c_int, [pp, c_void_p, c_size_t, c_void_p]),
        "kla_chunk_backward_saved": (c_int, [POINTER(P.KlaBackwardParams), c_void_p, c_size_t,
                                             c_void_p]),
        # The state-gradient schedule (kla.h kla_state_grad): added after the saved states, so a
        # library without them still loads; a request other than AUTO then raises.
        "kla_chunk_backward_saved_as": (c_int, [POINTER(P.KlaBackwardParams), c_void_p,
                                                c_size_t, c_int, c_int32, c_void_p]),
        "kla_plan_chunk_backward_saved": (c_int, [POINTER(P.KlaBackwardParams), c_int, c_int32,
                                                  POINTER(P.KlaBackwardPlan)]),
        "kla_plan_chunk_backward_saved_for": (c_int, [POINTER(P.KlaBackwardParams),
                                                      POINTER(P.KlaDeviceInfo), c_int, c_int32,
                                                      POINTER(P.KlaBackwardPlan)]),
    }
    missing = []
    for name, (res, args) in saving.items():
        fn = getattr(lib, name, None)
        if fn is None:
            missing.append(name)
        else:
            fn.restype, fn.argtypes = res, args
    return missing


class Library:
    """One loaded libkla_cuda: the ctypes functions, checked against this package's ABI."""

    def __init__(self, path, abi_version=P.ABI_VERSION):
        self.path = path
        try:
            self.cdll = lib = ctypes.CDLL(path)
        except OSError as e:
            raise KlaLibraryError(f"kla: cannot load {path}: {e}") from None
        try:
            _declare(lib)
        except AttributeError as e:
            raise KlaLibraryError(f"kla: {path} is not libkla_cuda ABI {abi_version}: "
                                  f"{e}") from None
        self.version = lib.kla_version_string().decode()
        got = lib.kla_abi_version()
        if got != abi_version:
            raise KlaLibraryError(
                f"kla: {path} is ABI {got} (kla {self.version}), this package expects ABI "
                f"{abi_version}: install the library built with this package "
                f"(pip install the package again)")
        self._check_layout(abi_version)
        self.missing = _declare_saving(lib)
        # Bound functions, cached: the per-call cost of the ops is a few attribute loads.
        self.chunk_forward = lib.kla_chunk_forward
        self.tokenwise_forward = lib.kla_tokenwise_forward
        self.workspace_size = lib.kla_workspace_size
        self.validate_raw = lib.kla_validate
        self._init = lib.kla_params_init_abi
        self._template = self._new_params(abi_version)
        self.chunk_backward = lib.kla_chunk_backward
        self.backward_workspace_size = lib.kla_backward_workspace_size
        bp = P.KlaBackwardParams()
        lib.kla_backward_params_init_abi(ctypes.addressof(bp), abi_version,
                                         ctypes.sizeof(P.KlaBackwardParams))
        if bp.struct_size != ctypes.sizeof(P.KlaBackwardParams) or bp.forward.eta_value != 1.0:
            raise KlaLibraryError(f"kla: kla_backward_params has another layout in {self.path}")
        self._backward_template = bp
        # Saved states (save_states=True): kla_saved_states_size(&params) -> bytes (0: cannot
        # save, kla_last_error_message says why), kla_chunk_forward_saving(&params, saved,
        # saved_size, stream), kla_chunk_backward_saved(&backward_params, saved, saved_size,
        # stream).
        self.saved_states_size = self._saving_entry("kla_saved_states_size")
        self.chunk_forward_saving = self._saving_entry("kla_chunk_forward_saving")
        self.chunk_backward_saved = self._saving_entry("kla_chunk_backward_saved")
        # kla_chunk_backward_saved_as(&backward_params, saved, saved_size, state_grad,
        # chain_segment, stream): on a schedule requested (kla.h kla_state_grad).
        self.chunk_backward_saved_as = self._saving_entry("kla_chunk_backward_saved_as")

    def _saving_entry(self, name):
        """The bound entry point, or (a library without saved states) a stand-in of that name
        that raises KlaLibraryError saying so when called."""
        if name not in self.missing:
            return getattr(self.cdll, name)
        path = self.path

        def missing(*args):
            raise KlaLibraryError(f"kla: {path} has no {name}: it is an ABI {P.ABI_VERSION} "
                                  f"library built before that entry point (save_states=True "
                                  f"needs the saved states', state_grad= the schedule's); "
                                  f"rebuild it (pip install the package again)")
        missing.__name__ = name
        return missing

    def _check_layout(self, abi_version):
        """kla_params_init_abi must zero exactly sizeof(KlaParams) bytes and set our defaults."""
        size, pad = ctypes.sizeof(P.KlaParams), 64
        buf = (ctypes.c_ubyte * (size + pad))(*([0xA5] * (size + pad)))
        self.cdll.kla_params_init_abi(ctypes.addressof(buf), abi_version, size)
        if bytes(buf[size:]) != bytes([0xA5] * pad):
            raise KlaLibraryError(f"kla: kla_params is larger in {self.path} than in this "
                                  f"package ({size} bytes)")
        if bytes(buf[size - 8:size]) != bytes(8):  # the last field, zeroed by the library
            raise KlaLibraryError(f"kla: kla_params is smaller in {self.path} than in this "
                                  f"package ({size} bytes), or another ABI")
        p = P.KlaParams.from_buffer_copy(bytes(buf[:size]))
        if not (p.abi_version == abi_version and p.struct_size == size and p.eta_value == 1.0
                and p.eps == 0.0 and p.scale == 0.0 and p.dtype == P.DTYPE_BF16
                and p.coefficient == P.COEFF_KACZMARZ and p.readout == P.READOUT_SCALE
                and p.batch == 0 and p.arithmetic == P.ARITHMETIC_ACCURATE
                and p.path == P.PATH_AUTO and p.value_slice == 0):
            raise KlaLibraryError(f"kla: the defaults kla_params_init writes in {self.path} "
                                  f"are not where this package expects them")

    def _new_params(self, abi_version=P.ABI_VERSION):
        p = P.KlaParams()
        self._init(ctypes.addressof(p), abi_version, ctypes.sizeof(P.KlaParams))
        return p

    def params(self):
        """A fresh kla_params with the library's defaults (a copy of the checked template)."""
        return P.KlaParams.from_buffer_copy(self._template)

    def backward_params(self):
        """A fresh kla_backward_params with the library's defaults."""
        return P.KlaBackwardParams.from_buffer_copy(self._backward_template)

    def error(self, status):
        name = self.cdll.kla_status_string(status).decode()
        msg = self.cdll.kla_last_error_message().decode()
        return KlaError(status, name, msg)

    def check(self, status):
        if status:
            raise self.error(status)

    def validate(self, p):
        self.check(self.cdll.kla_validate(ctypes.byref(p)))

    def plan_backward_saved(self, bp, state_grad=P.STATE_GRAD_AUTO, chain_segment=0,
                            device=None):
        """kla_plan_chunk_backward_saved(_for with a KlaDeviceInfo `device`): the saved backward's
        KlaBackwardPlan for these kla_backward_params; raises KlaError where the library refuses."""
        plan = P.KlaBackwardPlan()
        if device is None:
            entry = self._saving_entry("kla_plan_chunk_backward_saved")
            st = entry(ctypes.byref(bp), state_grad, chain_segment, ctypes.byref(plan))
        else:
            entry = self._saving_entry("kla_plan_chunk_backward_saved_for")
            st = entry(ctypes.byref(bp), ctypes.byref(device), state_grad, chain_segment,
                       ctypes.byref(plan))
        self.check(st)
        return plan

    def plan_chunk(self, p, device=None):
        plan = P.KlaPlan()
        if device is None:
            self.check(self.cdll.kla_plan_chunk_forward(ctypes.byref(p), ctypes.byref(plan)))
        else:
            self.check(self.cdll.kla_plan_chunk_forward_for(ctypes.byref(p), ctypes.byref(device),
                                                            ctypes.byref(plan)))
        return plan

    def plan_tokenwise(self, p):
        plan = P.KlaPlan()
        self.check(self.cdll.kla_plan_tokenwise_forward(ctypes.byref(p), ctypes.byref(plan)))
        return plan

    def device_info(self, index):
        info = P.KlaDeviceInfo()
        self.check(self.cdll.kla_device_info_get(index, ctypes.byref(info)))
        return info


_lock = threading.Lock()
_loaded = None  # a Library, or the KlaLibraryError that loading raised


def load():
    """The process's Library (loaded and checked at the first call), or KlaLibraryError."""
    global _loaded
    lib = _loaded
    if isinstance(lib, Library):
        return lib
    with _lock:
        if _loaded is None:
            _loaded = _load_uncached()
        if isinstance(_loaded, Exception):
            raise _loaded
        return _loaded


def _load_uncached():
    path = library_path()
    if not os.path.exists(path):
        info = _build_info()
        if info.get("cuda") is False:
            return KlaLibraryError(
                "kla: this kla package was built without CUDA (nvcc was not found when it was "
                "built), so it has no kernels: reinstall it on a machine with the CUDA toolkit "
                "(pip install . from the repository), or carry a wheel built there")
        return KlaLibraryError(f"kla: {path} does not exist: install the package with pip "
                               f"(pip install .), or set KLA_CUDA_LIBRARY to a libkla_cuda.so."
                               f"{P.ABI_VERSION}")
    try:
        return Library(path)
    except KlaLibraryError as e:
        return e


def reset():
    """Forgets the loaded library: load() looks again (tests; after KLA_CUDA_LIBRARY changes)."""
    global _loaded
    with _lock:
        _loaded = None


def is_available():
    """True when the library loads and passes the ABI check (a GPU is not needed for that)."""
    try:
        load()
        return True
    except KlaLibraryError:
        return False
