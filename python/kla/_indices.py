"""int32 host and device copies of cu_seqlens and of state-pool indices, as the C ABI takes them.

The library validates the host copy (cu_seqlens_host, state_indices_host) and its kernels read
the device copy. Given on the CPU, the values need no synchronisation: the device copy is an
asynchronous copy from pinned memory. Given on the device, the host copy costs one
device-to-host copy (it waits for the stream), unless the caller also passes the host copy
(cu_seqlens_cpu / ssm_state_indices_cpu). For cu_seqlens (remember=True) the copy is remembered
for the tensor object and its version counter (which every torch operation writing the tensor
bumps): a later call with the same tensor unchanged reuses it, so the backward of a forward, or
the layers of a model given one cu_seqlens, wait for one copy, not one each (values written into
the tensor by other means, which leave the counter as it was, are not seen: pass the host copy
then). Pool indices, which servers rewrite between steps, are copied every call. During CUDA-graph
capture a device-to-host copy is impossible: then the values must come on the CPU. A CPU tensor
captured in a graph is copied from a pinned buffer that is kept for the life of the process (one
per distinct set of values), so the graph bakes those values in: every replay uses the captured
values.
"""
import threading
import weakref

import torch

_baked = {}  # (name, values) -> pinned int32 CPU tensor read by captured copies; never freed
_baked_lock = threading.Lock()
# id(device tensor) -> (weak reference to it, its version counter then, its int32 host copy); an
# entry goes when its tensor does.
_copies = {}
_copies_lock = threading.Lock()


def _version(t):
    """t's version counter, or None where it has none (inference-mode tensors)."""
    try:
        return t._version
    except RuntimeError:
        return None


def remembered_host(t):
    """The host copy remembered for tensor t (remember_host), if t is that tensor and unchanged
    since (the same version counter); else None."""
    entry = _copies.get(id(t))
    if entry is None or entry[0]() is not t:
        return None
    version = _version(t)
    return entry[2] if version is not None and version == entry[1] else None


def remember_host(t, host):
    """Remembers `host` as the host copy of tensor t at its current version (not for tensors
    without a version counter)."""
    version = _version(t)
    if version is None:
        return
    key = id(t)

    def forget(ref, key=key):
        with _copies_lock:
            if key in _copies and _copies[key][0] is ref:
                del _copies[key]

    with _copies_lock:
        _copies[key] = (weakref.ref(t, forget), version, host)


def _capturing():
    return torch.cuda.is_current_stream_capturing()


def _host_int32(t, name):
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"kla: {name} must be int32 or int64, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"kla: {name} must be 1-d, got shape {tuple(t.shape)}")
    return t.to(torch.int32).contiguous() if t.dtype != torch.int32 else t.contiguous()


def host_and_device(t, t_cpu, device, name, remember=False):
    """(host int32 CPU tensor, device int32 tensor on `device`) for `t` (CPU or CUDA, int32 or
    int64), using `t_cpu` (the same values on the CPU) as the host copy where given; remember:
    a device-to-host copy is remembered for t and reused while t is unchanged (module
    docstring)."""
    if t.device.type == "cpu":
        host = _host_int32(t, name)
        if device.type != "cuda":  # tests that build params on the CPU: no device copy
            return host, host
        if _capturing():
            key = (name, tuple(host.tolist()))
            with _baked_lock:
                pinned = _baked.get(key)
                if pinned is None:
                    pinned = _baked[key] = host.pin_memory()
            dev = torch.empty(host.shape, dtype=torch.int32, device=device)
            dev.copy_(pinned, non_blocking=True)
        else:
            dev = host.pin_memory().to(device, non_blocking=True)
        return host, dev
    if t.device != device:
        raise ValueError(f"kla: {name} is on {t.device}, the inputs on {device}")
    dev = t if t.dtype == torch.int32 and t.is_contiguous() else _host_int32(t, name)
    if t_cpu is not None:
        if t_cpu.device.type != "cpu":
            raise ValueError(f"kla: {name}_cpu must be a CPU tensor, got {t_cpu.device}")
        host = _host_int32(t_cpu, name + "_cpu")
        if host.shape != dev.shape:
            raise ValueError(f"kla: {name}_cpu has {host.shape[0]} entries, {name} {dev.shape[0]}")
        return host, dev
    if _capturing():
        raise RuntimeError(
            f"kla: {name} is a CUDA tensor and this call is being captured in a CUDA graph, where "
            f"the host copy the library validates cannot be made (a device-to-host copy): pass "
            f"{name} on the CPU (the graph then bakes those values in), or pass its CPU copy as "
            f"{name}_cpu=")
    host = remembered_host(t) if remember else None
    if host is None:
        host = dev.cpu()
        if remember:
            remember_host(t, host)
    return host, dev
