"""kla.nn: a KLA layer for models, with the constructor arguments of flash-linear-attention's
GatedDeltaNet layer where they apply (fla.layers.GatedDeltaNet).

    layer = kla.nn.KLA(hidden_size=1024, head_dim=128, num_heads=8, expand_v=1)
    o, _, _ = layer(x)                       # x [B, T, hidden_size], as FLA's layers return

Per token (the paper's layer, Section 3; GDN's with the Kaczmarz coefficient):
    q, k, v = SiLU(causal depthwise conv(x W_q)), ... (use_short_conv), else the projections
    eta = sigmoid(x W_b) (x 2 with allow_neg_eigval),  g = -exp(A_log) softplus(x W_a + dt_bias)
    S_t = exp(g) S + beta k (v - exp(g) S^T k)^T,  beta = eta / (|k|^2 + eps)
    o = S^T q / |q| (readout "q_l2norm", the paper's), or S^T q scale / FLA's qk l2-norm
    y = W_o (RMSNorm(o) * SiLU(x W_g))  (use_gate; RMSNorm(o) without)
impl="kernels" runs kla.chunk_kla / kla.fused_recurrent_kla (CUDA); impl="torch" runs
kla.torch_impl.chunk_kla (PyTorch, any device), the float32 reference a kernel-trained model is
compared with. Packed sequences (cu_seqlens) are supported, the convolution kept inside each.
"""
import math

import torch
from torch import nn
from torch.nn import functional as F

from . import api, torch_impl

_MODES = ("chunk", "fused_recurrent")
_IMPLS = ("kernels", "torch")
_READOUTS = ("q_l2norm", "scale", "qk_l2norm")
_ARITHMETICS = ("accurate", "fast")


def _causal_conv(x, weight, bias, cu_seqlens):
    """Depthwise causal convolution over T of x [B, T, C] with weight [C, W]: y_t = sum_s
    weight[:, W-1-s] x_{t-s}, taps before a sequence's start (cu_seqlens) read zero."""
    B, T, C = x.shape
    W = weight.shape[1]
    start = torch.zeros(T, dtype=torch.long, device=x.device)
    if cu_seqlens is not None:
        cu = cu_seqlens.to(device=x.device, dtype=torch.long)
        seq = torch.bucketize(torch.arange(T, device=x.device), cu[1:], right=True)
        start = cu[seq]
    pos = torch.arange(T, device=x.device)
    y = x * weight[:, W - 1]
    for s in range(1, W):
        shifted = F.pad(x, (0, 0, s, 0))[:, :T]
        keep = (pos - s >= start).to(x.dtype)[None, :, None]
        y = y + shifted * keep * weight[:, W - 1 - s]
    return y if bias is None else y + bias


def _at_least_fp32(x):
    """x in fp32, or as it is when wider (float64 modules stay float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class ShortConvolution(nn.Module):
    """Causal depthwise convolution with SiLU (FLA's ShortConvolution), varlen-aware."""

    def __init__(self, channels, kernel_size=4, bias=False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, kernel_size))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None
        nn.init.kaiming_uniform_(self.weight.unsqueeze(1), a=math.sqrt(5))

    def forward(self, x, cu_seqlens=None):
        return F.silu(_causal_conv(x, self.weight, self.bias, cu_seqlens))


class RMSNormGated(nn.Module):
    """RMSNorm over the last dimension, times SiLU(gate) when a gate is given (FLA's
    FusedRMSNormGated, unfused)."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, gate=None):
        x32 = _at_least_fp32(x)
        y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.eps) * self.weight
        if gate is not None:
            y = y * F.silu(_at_least_fp32(gate))
        return y.to(x.dtype)


class KLA(nn.Module):
    """A KLA attention layer (module docstring). FLA GatedDeltaNet's arguments: hidden_size,
    expand_v, head_dim, num_heads, num_v_heads (None: num_heads), mode ('chunk' or
    'fused_recurrent'), use_gate, use_short_conv, allow_neg_eigval, conv_size, conv_bias,
    layer_idx, norm_eps. kla's: eps (the Kaczmarz epsilon, 1e-6 as the paper), readout
    ('q_l2norm' as the paper, 'scale', or 'qk_l2norm' for FLA's use_qk_l2norm_in_kernel), impl
    ('kernels' or 'torch'), arithmetic ('accurate' or 'fast': the chunk kernels' contract, forward
    and backward, kla.chunk_kla; the torch implementation and mode 'fused_recurrent' have one
    arithmetic), save_states (False; True: kla.chunk_kla's save_states, the forward saving each
    chunk's state for a faster backward, 48 KB per 64-token chunk and value head kept from forward
    to backward: impl 'kernels' and mode 'chunk' only, else a ValueError here; bf16,
    arithmetic 'fast' and head dims 128, else chunk_kla's ValueError at the first forward). Any
    other keyword is a TypeError."""

    def __init__(self, hidden_size=2048, expand_v=2, head_dim=256, num_heads=6,
                 num_v_heads=None, mode="chunk", use_gate=True, use_short_conv=True,
                 allow_neg_eigval=False, conv_size=4, conv_bias=False, layer_idx=None,
                 norm_eps=1e-5, *, eps=1e-6, readout="q_l2norm", impl="kernels",
                 arithmetic="accurate", save_states=False, **kwargs):
        super().__init__()
        if kwargs:
            raise TypeError(f"kla.nn.KLA: unexpected keyword argument '{next(iter(kwargs))}'")
        if mode not in _MODES:
            raise ValueError(f"kla.nn.KLA: mode must be one of {_MODES}, got {mode!r}")
        if impl not in _IMPLS:
            raise ValueError(f"kla.nn.KLA: impl must be one of {_IMPLS}, got {impl!r}")
        if readout not in _READOUTS:
            raise ValueError(f"kla.nn.KLA: readout must be one of {_READOUTS}, got {readout!r}")
        if arithmetic not in _ARITHMETICS:
            raise ValueError(f"kla.nn.KLA: arithmetic must be one of {_ARITHMETICS}, got "
                             f"{arithmetic!r}")
        if not isinstance(save_states, bool):
            raise ValueError(f"kla.nn.KLA: save_states must be True or False, got "
                             f"{save_states!r}")
        if save_states and (impl != "kernels" or mode != "chunk"):
            # Only kla.chunk_kla can save: refused rather than ignored.
            raise ValueError(f"kla.nn.KLA: save_states=True needs impl='kernels' and "
                             f"mode='chunk' (the chunk kernels save the states), got "
                             f"impl={impl!r}, mode={mode!r}")
        num_v_heads = num_heads if num_v_heads is None else num_v_heads
        if num_v_heads % num_heads:
            raise ValueError(f"kla.nn.KLA: num_v_heads = {num_v_heads} must be a multiple of "
                             f"num_heads = {num_heads}")
        head_v_dim = int(head_dim * expand_v)
        if head_v_dim != head_dim * expand_v:
            raise ValueError(f"kla.nn.KLA: head_dim * expand_v = {head_dim * expand_v} must be "
                             f"an integer")
        self.hidden_size, self.mode, self.impl, self.readout = hidden_size, mode, impl, readout
        self.arithmetic, self.save_states = arithmetic, save_states
        self.num_heads, self.num_v_heads = num_heads, num_v_heads
        self.head_k_dim, self.head_v_dim = head_dim, head_v_dim
        self.key_dim, self.value_dim = num_heads * head_dim, num_v_heads * head_v_dim
        self.use_gate, self.use_short_conv = use_gate, use_short_conv
        self.allow_neg_eigval, self.eps, self.layer_idx = allow_neg_eigval, eps, layer_idx

        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        self.a_proj = nn.Linear(hidden_size, num_v_heads, bias=False)
        self.b_proj = nn.Linear(hidden_size, num_v_heads, bias=False)
        # GDN's decay parametrisation: A in (0, 16], dt in [1e-3, 1e-1] (inverse softplus).
        self.A_log = nn.Parameter(torch.log(torch.empty(num_v_heads).uniform_(0, 16)))
        dt = torch.exp(torch.rand(num_v_heads) * (math.log(0.1) - math.log(1e-3)) +
                       math.log(1e-3)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        if use_short_conv:
            self.q_conv1d = ShortConvolution(self.key_dim, conv_size, conv_bias)
            self.k_conv1d = ShortConvolution(self.key_dim, conv_size, conv_bias)
            self.v_conv1d = ShortConvolution(self.value_dim, conv_size, conv_bias)
        if use_gate:
            self.g_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        self.o_norm = RMSNormGated(head_v_dim, eps=norm_eps)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)

    def forward(self, hidden_states, attention_mask=None, past_key_values=None, use_cache=False,
                output_attentions=False, cu_seqlens=None, **kwargs):
        """hidden_states [B, T, hidden_size] (B = 1 with cu_seqlens) -> (o, None, None).
        attention_mask [B, T] (1 / True on real tokens, as FLA's layers take it, padding on either
        side): the real tokens of each row run as one packed sequence and the padded positions
        of o are zero."""
        if attention_mask is not None:
            return self._masked(hidden_states, attention_mask, cu_seqlens, past_key_values,
                                use_cache, output_attentions, kwargs)
        if past_key_values is not None or use_cache:
            raise NotImplementedError("kla.nn.KLA: past_key_values / use_cache are not supported "
                                      "(call kla.fused_recurrent_kla with a state for decoding)")
        if kwargs:
            raise TypeError(f"kla.nn.KLA.forward: unexpected keyword argument "
                            f"'{next(iter(kwargs))}'")
        B, T, _ = hidden_states.shape
        x = hidden_states
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.use_short_conv:
            q = self.q_conv1d(q, cu_seqlens)
            k = self.k_conv1d(k, cu_seqlens)
            v = self.v_conv1d(v, cu_seqlens)
        else:
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        q = q.view(B, T, self.num_heads, self.head_k_dim)
        k = k.view(B, T, self.num_heads, self.head_k_dim)
        v = v.view(B, T, self.num_v_heads, self.head_v_dim)
        eta = _at_least_fp32(self.b_proj(x)).sigmoid()
        if self.allow_neg_eigval:
            eta = eta * 2.0
        g = -_at_least_fp32(self.A_log).exp() * F.softplus(_at_least_fp32(self.a_proj(x)) +
                                                           self.dt_bias)
        readout = "scale" if self.readout == "qk_l2norm" else self.readout
        args = dict(eps=self.eps, cu_seqlens=cu_seqlens, readout=readout,
                    use_qk_l2norm_in_kernel=self.readout == "qk_l2norm")
        if self.impl == "torch":
            o, _ = torch_impl.chunk_kla(q, k, v, g, eta, **args)
        elif self.mode == "chunk":
            o, _ = api.chunk_kla(q, k, v, g, eta, arithmetic=self.arithmetic,
                                 save_states=self.save_states, **args)
        else:
            o, _ = api.fused_recurrent_kla(q, k, v, g, eta, **args)
        gate = None
        if self.use_gate:
            gate = self.g_proj(x).view(B, T, self.num_v_heads, self.head_v_dim)
        o = self.o_norm(o, gate).reshape(B, T, self.value_dim)
        return self.o_proj(o), None, None

    def _masked(self, x, mask, cu_seqlens, past_key_values, use_cache, output_attentions, kwargs):
        """forward with a padding mask: unpad into one packed row (cu_seqlens), run, pad back."""
        B, T, _ = x.shape
        if cu_seqlens is not None:
            raise ValueError("kla.nn.KLA: pass attention_mask or cu_seqlens, not both")
        if tuple(mask.shape) != (B, T):
            raise ValueError(f"kla.nn.KLA: attention_mask must be [B, T] = {(B, T)}, got "
                             f"{tuple(mask.shape)}")
        keep = mask.to(device=x.device).bool()
        if bool(keep.all()):
            return self.forward(x, None, past_key_values, use_cache, output_attentions, None,
                                **kwargs)
        lengths = keep.sum(1)
        cu = torch.zeros(B + 1, dtype=torch.int32, device=x.device)
        cu[1:] = lengths.cumsum(0)
        y, _, cache = self.forward(x[keep][None], None, past_key_values, use_cache,
                                   output_attentions, cu, **kwargs)
        out = x.new_zeros(B, T, y.shape[-1])
        out[keep] = y[0]
        return out, None, cache
