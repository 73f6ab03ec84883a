/* kla.h — C ABI of the KLA CUDA kernels (Kaczmarz Linear Attention, SPEC §1, §3).
 *
 * Layouts follow flash-linear-attention (element strides, last dimension contiguous):
 *   q, k  [B, T, H,  K]     dtype of the call (fp32 / bf16 / fp16)
 *   v, o  [B, T, HV, V]     HV a multiple of H; value head hv reads query/key head hv / (HV/H)
 *   g     [B, T, HV] fp32   natural-log decay g = ln(alpha) <= 0, optional (absent: alpha = 1)
 *   eta   [B, T, HV] fp32   gate, optional (absent: eta_value everywhere)
 *   states [N, HV, K, V] fp32, contiguous; N = B, or the number of packed sequences when
 *   cu_seqlens ([N+1] int32, B = 1) is given.
 *
 * Per token (one head): S~ = alpha S; e = v - S~^T k; beta = eta / (|k|^2 + eps) (Kaczmarz) or
 * beta = eta (given, plain gated delta rule); S = S~ + beta k e^T; o = S^T q * scale (or / |q|).
 * Degenerate convention: |k|^2 + eps == 0 gives beta = 0 (the token only decays the state).
 *
 * Every entry point validates its arguments on the host first; on an error it returns a status,
 * sets a thread-local message naming the argument (kla_last_error_message) and launches nothing.
 * Entry points are thread-safe, never synchronise the host and never allocate device memory,
 * so they can be captured in a CUDA graph; results are bitwise reproducible run to run.
 * kla_chunk_forward's two-pass paths use a caller-allocated device workspace
 * (kla_params.workspace, sized by kla_workspace_size).
 *
 * Kernel plans: which kernel path runs, and with which tiling, is decided on the host before
 * anything is launched. kla_plan_chunk_forward / kla_plan_tokenwise_forward return that plan
 * (path, tiling, workspace bytes and the reason, naming why each preferred path declined) without
 * launching; kla_params.path and kla_params.value_slice request a path and tiling explicitly, and
 * a request the call cannot honour is an error (KLA_ERROR_UNSUPPORTED_PATH), never a fallback.
 * The library reads no environment variables.
 *
 * ABI: kla_params_init stamps abi_version and struct_size with the caller's header values (it is a
 * macro over kla_params_init_abi); every entry point refuses a struct stamped for another layout
 * (KLA_ERROR_ABI_MISMATCH), so a program built against another kla.h is detected at its first
 * call. Bindings compare KLA_ABI_VERSION with kla_abi_version() once at load. The library's
 * SONAME carries the ABI version (libkla_cuda.so.<KLA_ABI_VERSION>), so a program linked against
 * an older library does not load this one at all.
 */
#ifndef KLA_KLA_H_
#define KLA_KLA_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define KLA_API
#else
#define KLA_API __attribute__((visibility("default")))
#endif

/* The layout of the structs below; CMake reads the SONAME from this line. */
#define KLA_ABI_VERSION 5

/* A CUDA stream: the same type as cudaStream_t / CUstream (NULL = legacy default stream). */
typedef struct CUstream_st* kla_stream_t;

typedef enum kla_status {
  KLA_SUCCESS = 0,
  KLA_ERROR_NULL_POINTER = 1,         /* a required pointer is NULL */
  KLA_ERROR_INVALID_SIZE = 2,         /* a size is zero or negative */
  KLA_ERROR_SHAPE_MISMATCH = 3,       /* sizes are inconsistent (HV % H, cu_seqlens with B > 1) */
  KLA_ERROR_BAD_STRIDE = 4,           /* a stride is non-positive or makes outputs overlap */
  KLA_ERROR_MISALIGNED = 5,           /* a pointer or stride breaks 16-byte alignment */
  KLA_ERROR_UNSUPPORTED_DTYPE = 6,    /* dtype is not fp32 / bf16 / fp16 */
  KLA_ERROR_UNSUPPORTED_HEAD_DIM = 7, /* K or V not a multiple of 16 in [16, 256] */
  KLA_ERROR_BAD_CU_SEQLENS = 8, /* cu_seqlens not starting at 0, decreasing, or not ending at T */
  KLA_ERROR_BAD_INDEX = 9,      /* a state pool index outside [-1, pool_size) */
  KLA_ERROR_INVALID_VALUE = 10, /* eps < 0, a non-finite scalar, an unknown enum value */
  KLA_ERROR_NO_DEVICE = 11,     /* no usable CUDA device */
  KLA_ERROR_CUDA = 12,          /* the CUDA runtime reported an error (message has it) */
  KLA_ERROR_UNSUPPORTED_PATH = 13, /* the requested path / tiling cannot run this call, or no
                                      path can (the message says why) */
  KLA_ERROR_ABI_MISMATCH = 14      /* params stamped for another kla.h (kla_params_init) */
} kla_status;

typedef enum kla_dtype { KLA_DTYPE_FP32 = 0, KLA_DTYPE_BF16 = 1, KLA_DTYPE_FP16 = 2 } kla_dtype;

/* How beta is formed: Kaczmarz beta = eta / (|k|^2 + eps) computed in fp32 in the kernel from
 * the raw key, or given beta = eta (plain gated delta rule, keys used as they are). */
typedef enum kla_coefficient { KLA_COEFF_KACZMARZ = 0, KLA_COEFF_GIVEN = 1 } kla_coefficient;

/* How o is read: o = S^T q * scale; o = S^T q / |q| (in-kernel q l2-norm; 0 for q = 0; scale
 * unused); or QK_L2NORM, flash-linear-attention's use_qk_l2norm_in_kernel: q and k each replaced
 * by x / sqrt(|x|^2 + 1e-6) in fp32 inside the kernel (nothing rounded to the dtype), the
 * coefficient formed from the normalised key, and o = S^T q^ * scale. */
typedef enum kla_readout {
  KLA_READOUT_SCALE = 0,
  KLA_READOUT_Q_L2NORM = 1,
  KLA_READOUT_QK_L2NORM = 2
} kla_readout;

/* Arithmetic contract of the chunkwise prefill (ignored by the tokenwise entry point and the
 * backward). docs/accuracy.md has the measured errors.
 * ACCURATE (default): every tensor-core product keeps at least 16 significant bits of its fp32
 *   operands (split into two parts), so the output's error is essentially its own rounding to the
 *   dtype: bf16 <= 2e-3, fp16 <= 3e-4, fp32 ~5e-7 relative RMS against a 133-bit reference (T =
 *   2048, D = 128).
 * FAST: the state products' operands may be rounded once to the storage dtype, as other
 *   delta-rule libraries do; the contract is an output error no larger than flash-linear-
 *   attention's on the same inputs, and never NaN / Inf for finite inputs. bf16 / fp16: the
 *   WY_TRANSPOSED scan rounds the state (in K S and Q S) and the update (K^T X) once to the dtype,
 *   7-9% faster there (docs/performance.md); the WY, TF32 and GENERIC paths run their
 *   ACCURATE arithmetic, which meets the contract. fp32: keys, queries and the state enter the
 *   products as bf16 hi + lo (16 significant bits) on the WY path, about 3x faster on H100 / H200
 *   at ~5e-6 relative RMS on random inputs and up to ~2e-5 on colinear or repeated keys.
 * kla_plan.arithmetic says which arithmetic a call's kernels run. */
typedef enum kla_arithmetic { KLA_ARITHMETIC_ACCURATE = 0, KLA_ARITHMETIC_FAST = 1 } kla_arithmetic;

/* Kernel paths (kla_plan, kla_params.path). docs/architecture.md says what each one is.
 *   WY             chunkwise, sm_90a: WY prep + scan on wgmma, value slices of 8, 16 or 32 columns
 *                  (bf16 / fp16, and fp32 with arithmetic FAST; K in {64, 96, 128})
 *   WY_TRANSPOSED  chunkwise, sm_90a: the WY scan with the state transposed in registers, 64-column
 *                  slices (bf16 / fp16; K in {64, 128}; V a multiple of 64)
 *   TF32           chunkwise, sm_80 and later: two passes on split-TF32 tensor cores (any dtype,
 *                  any head dims; the accurate fp32 default)
 *   GENERIC        chunkwise, workspace-free single pass (any device, any head dims; slowest)
 *   TOKENWISE      the decode kernel (kla_tokenwise_forward's only path) */
typedef enum kla_path {
  KLA_PATH_AUTO = 0,
  KLA_PATH_WY = 1,
  KLA_PATH_WY_TRANSPOSED = 2,
  KLA_PATH_TF32 = 3,
  KLA_PATH_GENERIC = 4,
  KLA_PATH_TOKENWISE = 5
} kla_path;

typedef struct kla_params {
  /* Stamped by kla_params_init: the caller's KLA_ABI_VERSION and sizeof(kla_params). Checked
   * first at every entry. */
  uint32_t abi_version;
  uint32_t struct_size;

  kla_dtype dtype;     /* of q, k, v and o */
  int64_t batch;       /* B (1 when cu_seqlens is given) */
  int64_t seq_len;     /* T (total packed tokens when cu_seqlens is given) */
  int64_t num_heads;   /* H: query/key heads */
  int64_t num_v_heads; /* HV: value heads, a multiple of H */
  int64_t head_dim_k;  /* K */
  int64_t head_dim_v;  /* V */

  /* Element strides of the B, T and head dimensions (the last dimension is contiguous). Pointers
   * and strides (in bytes) must be multiples of 16. Inputs may overlap; o may not. */
  const void* q;
  int64_t q_strides[3];
  const void* k;
  int64_t k_strides[3];
  const void* v;
  int64_t v_strides[3];
  void* o;
  int64_t o_strides[3];

  const float* g; /* [B,T,HV] log decay, element strides of B and T; HV contiguous; NULL = none */
  int64_t g_strides[2];
  const float* eta; /* [B,T,HV], strides like g; NULL = eta_value for every token */
  int64_t eta_strides[2];
  float eta_value;

  float eps;   /* >= 0 */
  float scale; /* read-out scale (SCALE, QK_L2NORM); kla_params_init sets K^-1/2 */
  kla_coefficient coefficient;
  kla_readout readout;

  /* States [N,HV,K,V] fp32 contiguous. initial_state NULL = zero; final_state NULL = not
   * written; final_state == initial_state updates in place. */
  const float* initial_state;
  float* final_state;

  /* State pool (decode serving): state_pool [pool_size,HV,K,V] fp32; sequence n reads and
   * writes pool row state_indices[n] in place; index -1 skips the sequence (its o rows and
   * state are left untouched). state_indices is on the device and read by the kernel;
   * state_indices_host is a host copy of the same values used for validation (required).
   * Excludes initial_state / final_state. */
  float* state_pool;
  int64_t pool_size;
  const int32_t* state_indices;
  const int32_t* state_indices_host;

  /* Variable lengths: cu_seqlens [num_seqs+1] int32 on the device (read by the kernel) and the
   * same values on the host in cu_seqlens_host (validated: starts at 0, non-decreasing, ends at
   * T). Needs batch == 1. NULL = N = B sequences of length T. */
  const int32_t* cu_seqlens;
  const int32_t* cu_seqlens_host;
  int64_t num_seqs;

  /* Device workspace of kla_chunk_forward (ignored by kla_tokenwise_forward): workspace_size
   * bytes, 16-byte aligned, at least kla_workspace_size(p); the call overwrites it, so calls in
   * flight at the same time need separate workspaces. NULL = no workspace: only the GENERIC path
   * can run (correct but many times slower; kla_plan_chunk_forward's reason says so). */
  void* workspace;
  size_t workspace_size;

  /* Arithmetic contract of kla_chunk_forward (kla_arithmetic above); kla_params_init sets
   * ACCURATE. */
  kla_arithmetic arithmetic;

  /* Path request (kla_path above): AUTO lets the plan choose. Any other value runs that path or
   * fails with KLA_ERROR_UNSUPPORTED_PATH and a message saying why it cannot run this call. */
  kla_path path;
  /* Value columns per scan block, 0 = the plan's choice; needs an explicit path. WY: 8 (K >= 96),
   * 16 or 32; WY_TRANSPOSED: 64; TF32: 8, 16 or 32; GENERIC: 16 or 32; TOKENWISE: 16. V must be
   * a multiple of it. */
  int32_t value_slice;
  /* Sequence split of kla_chunk_forward (docs/architecture.md, 'Sequence split'): 0 = the plan's
   * choice, 1 = never, 2..16 = cut every sequence into that many chunk-aligned segments. The
   * segments run in parallel from the state [I | 0] with values [0 | v], which gives each one's
   * affine map S_out = A S_in + L; a fold S_in(s+1) = A_s S_in(s) + L_s (fp32) gives every segment
   * its incoming state; a second pass runs the segments from it. About 2.3 times the work of one
   * pass, for up to 16 times the blocks: the plan takes it only where few sequences and value
   * heads leave the multiprocessors idle (N * HV <= 4, sequences of 8192 tokens or more). Needs
   * K + V <= 256 and the workspace kla_workspace_size reports (it includes the split's buffers
   * wherever the split may run). Occupies what was padding in ABI 5's first layout: a caller
   * that zeroed the struct gets 0. */
  int32_t segments;
} kla_params;

/* What a call will run (kla_plan_chunk_forward, kla_plan_tokenwise_forward). */
typedef struct kla_plan {
  kla_path path;             /* never AUTO; with segments > 1, the second pass's path */
  int32_t segments;          /* segments a sequence (1: one pass; kla_params.segments) */
  const char* path_name;     /* "wy", "wy_transposed", "tf32", "generic", "tokenwise" (static) */
  int32_t chunk_len;         /* tokens per chunk (0 for tokenwise) */
  int32_t value_slice;       /* value columns per scan block */
  int32_t stages;            /* copy stages of the scan's pipeline (1: none) */
  int32_t threads;           /* threads per scan (or tokenwise) block */
  int64_t blocks;            /* scan (or tokenwise) blocks */
  int64_t prep_blocks;       /* prep blocks (0 where the path has no prep kernel) */
  int64_t smem_bytes;        /* dynamic shared memory per scan block */
  int64_t prep_smem_bytes;   /* dynamic shared memory per prep block */
  size_t workspace_bytes;    /* bytes of kla_params.workspace this plan uses (0: none) */
  kla_arithmetic arithmetic; /* what the kernels run: FAST only where asked for and the path
                              * has a FAST arithmetic for the dtype (kla_arithmetic above) */
  char reason[768]; /* why this path and tiling; for AUTO, why each preferred path declined */
} kla_plan;

/* A device as the plan sees it (kla_plan_chunk_forward_for: plan without the device). */
typedef struct kla_device_info {
  int32_t compute_major, compute_minor;
  int32_t multiprocessors;
  int64_t max_smem_per_block; /* opt-in dynamic shared memory per block, bytes */
  int32_t tensor_maps;        /* 1: the driver encodes tensor maps (the WY paths need them) */
} kla_device_info;

/* kla_params_init(p): zeroes *p, stamps abi_version / struct_size with the values of the kla.h the
 * CALLER was compiled with (the macro passes them) and sets the defaults: eta_value 1, eps 0, scale
 * 0 (meaning K^-1/2 once head_dim_k is known), Kaczmarz coefficient, scale read-out, arithmetic
 * ACCURATE, path AUTO. Where the caller's layout is not the library's, the library writes only
 * the stamp (never more than the caller's struct_size bytes), so every entry point then refuses
 * the struct with KLA_ERROR_ABI_MISMATCH instead of reading it wrongly. Bindings that mirror the
 * struct call kla_params_init_abi with their own ABI version and size. */
KLA_API void kla_params_init_abi(kla_params* p, uint32_t abi_version, uint32_t struct_size);
#define kla_params_init(p) kla_params_init_abi((p), KLA_ABI_VERSION, (uint32_t)sizeof(kla_params))

/* Host-side validation only: needs no GPU and touches no device memory. */
KLA_API kla_status kla_validate(const kla_params* p);

/* Chunkwise forward (prefill): chunks of 64 tokens, any T, varlen, initial/final state. */
KLA_API kla_status kla_chunk_forward(const kla_params* p, kla_stream_t stream);

/* The plan kla_chunk_forward would run for *p on the current device, without launching: validates
 * *p, then fills *plan, or returns KLA_ERROR_UNSUPPORTED_PATH when the requested path (or, with
 * AUTO, every path) cannot run; the message then says why. */
KLA_API kla_status kla_plan_chunk_forward(const kla_params* p, kla_plan* plan);
/* The same for a described device (no GPU needed: sizing, tests, ahead-of-time planning). */
KLA_API kla_status kla_plan_chunk_forward_for(const kla_params* p, const kla_device_info* device,
                                              kla_plan* plan);
/* The plan of kla_tokenwise_forward (always the tokenwise kernel; its register family). */
KLA_API kla_status kla_plan_tokenwise_forward(const kla_params* p, kla_plan* plan);
/* The facts the plan uses about CUDA device `device` (queried once per device, then cached). */
KLA_API kla_status kla_device_info_get(int device, kla_device_info* info);

/* Tokenwise forward (decode, short speculative steps): T >= 1 tokens per sequence, the state
 * kept on chip across the call's tokens; in place (final_state == initial_state) or pooled. */
KLA_API kla_status kla_tokenwise_forward(const kla_params* p, kla_stream_t stream);

/* Bytes of device workspace kla_chunk_forward wants for these sizes (batch or num_seqs with
 * cu_seqlens, seq_len, num_heads, num_v_heads, head dims) and dtype: about 34 KB per 64-token
 * chunk and value head (each chunk's matrices), plus for fp32 with arithmetic FAST with
 * head_dim_k 64, 96 or 128 the chunk's keys and queries split into bf16 hi + lo (32 KB per chunk
 * and key head at K = 64, 64 KB at 96 or 128). Where the sequence split may run (segments >= 2,
 * or 0 with N * HV <= 4; and K + V <= 256, no state pool, B * T <= 2^31-1 and, for B > 1
 * unpacked, every given q, k, v, o, g, eta with a batch stride of seq_len token strides), the
 * size is the larger of that and the split's buffers (a call runs one or the other) for n
 * segments a sequence (segments, or 16 for 0), M = N n sequences
 * over the B * T tokens (T packed) and W = K + V: the passes' workspace (the size above for M
 * packed sequences over those tokens), 2 x tokens x HV x W dtype elements, 2 x M x HV x K x W and
 * 2 x M x HV x K x V floats and M + 1 int32, each of the seven pieces rounded up to 16 bytes
 * (where M exceeds 2^31-1 or these add up to more than 2^62 bytes, the split cannot run and
 * counts for nothing).
 * Head dims left 0 give the size for the largest call (for the split: the largest over K = 16 ..
 * 240, V = 256 - K). Pure host arithmetic; 0 for NULL or unusable sizes. The entry points
 * themselves never allocate. */
KLA_API size_t kla_workspace_size(const kla_params* p);

/* ---- Chunkwise backward (training; docs/api.md "Backward") ---------------------------------
 * The gradients of a loss through kla_chunk_forward with params `forward`, given dO (and
 * optionally d(final state)):
 *   dq, dk  [B,T,H,K]  dtype; summed over each key head's value heads in a fixed order
 *   dv      [B,T,HV,V] dtype
 *   dg, deta [B,T,HV]  fp32, strides like g (required exactly when forward.g / forward.eta is
 *                      given: dg is the gradient of the log decay g, deta that of eta)
 *   d_initial_state [N,HV,K,V] fp32 contiguous, or NULL (not written)
 * d_o [B,T,HV,V] dtype; d_final_state [N,HV,K,V] fp32 or NULL (zero). The forward's o,
 * final_state, workspace, path and value_slice are ignored; state_pool is refused.
 * Arithmetic: fp32 throughout (inputs rounded to the dtype are read exactly), the chunk form of
 * reference/include/kla/ref/grad_chunk.hpp in the normalised-key form, its products in
 * forward.arithmetic: ACCURATE (default) on split-TF32 tensor cores, about 2^-21 a product (fp32
 * grade); FAST, every dtype, with each operand one TF32 part (below 2^-10 relative: still finer
 * than the 16-bit operands of the peers' backward), 11-14% faster, except that for bf16 at
 * K = V = 128 the prep and both state scans run on bf16 tensor cores (the raw inputs exact, the
 * scaled operands split into two bf16 parts: below about 2^-16 a product, finer than TF32) and
 * the input gradients take one-part bf16 operands (below 2^-8), in about 0.55 of ACCURATE's
 * time with every gradient still no further from float64 than FLA's backward (docs/accuracy.md
 * has both contracts' measured errors beside FLA's, docs/performance.md the times); what the
 * forward would save (each chunk's incoming state) is recomputed here into the workspace, whose
 * size kla_backward_workspace_size reports ((2 K V + 64 (5 K + 2 V) + 5120) * 4 bytes per 64-token
 * chunk and value head). Deterministic (fixed reduction orders; no atomic sums), no allocation, no
 * host synchronisation.
 * Head dims up to 128 (a larger one is KLA_ERROR_UNSUPPORTED_HEAD_DIM). */
typedef struct kla_backward_params {
  uint32_t abi_version; /* stamped by kla_backward_params_init, checked first */
  uint32_t struct_size;
  kla_params forward; /* the forward call (kla_params_init it too) */
  const void* d_o;
  int64_t d_o_strides[3];
  const float* d_final_state;
  void* dq;
  int64_t dq_strides[3];
  void* dk;
  int64_t dk_strides[3];
  void* dv;
  int64_t dv_strides[3];
  float* dg;
  int64_t dg_strides[2];
  float* deta;
  int64_t deta_strides[2];
  float* d_initial_state;
  void* workspace; /* kla_backward_workspace_size bytes, 16-byte aligned (required) */
  size_t workspace_size;
} kla_backward_params;

/* Zeroes *p, stamps it and kla_params_init's its forward member. */
KLA_API void kla_backward_params_init_abi(kla_backward_params* p, uint32_t abi_version,
                                          uint32_t struct_size);
#define kla_backward_params_init(p) \
  kla_backward_params_init_abi((p), KLA_ABI_VERSION, (uint32_t)sizeof(kla_backward_params))
/* Host-side validation of a backward call (no GPU needed). */
KLA_API kla_status kla_validate_backward(const kla_backward_params* p);
/* Bytes of workspace kla_chunk_backward needs for p's sizes (0 for NULL or unusable sizes). */
KLA_API size_t kla_backward_workspace_size(const kla_backward_params* p);
KLA_API kla_status kla_chunk_backward(const kla_backward_params* p, kla_stream_t stream);
/* ---- Saved states (training; docs/api.md "Saved states") -------------------------------------
 * A forward can save what its backward would otherwise recompute by a state scan of its own: each
 * 64-token chunk's incoming state S and U = A^-1 diag(beta) (V^ - diag(e^G) K^ S) (the chunk's
 * values less what the state predicts, in the normalised-key form), both rounded to bf16 as the
 * backward's own scan rounds them, in records [chunk slot][HV] of (K V + 64 V) bf16 (S [K][V], then
 * U [64][V]; chunk slots as the workspace's): 48 KB a chunk and value head at K = V = 128, 0.75 GiB
 * at 32768 tokens and 32 value heads. The backward then skips that scan (12-14% of its time on an
 * H200 in a timing experiment; docs/performance.md has the status). Only where the backward runs
 * its bf16 kernels: dtype bf16, arithmetic FAST, K = V = 128, no state pool; the forward then runs
 * in one pass on a scan that saves: the plan's own path where it is the transposed scan (FAST) or
 * WY at 32 columns, otherwise WY at 32 columns (path AUTO, WY with value_slice 0 or 32, or
 * WY_TRANSPOSED with 0 or 64; segments 0 or 1; a sm_90a device). */
/* Bytes of the saved states of a forward call with these params; 0 where the call cannot save (or
 * p is NULL or unusable); kla_last_error_message then says why. Pure host arithmetic. */
KLA_API size_t kla_saved_states_size(const kla_params* p);
/* kla_chunk_forward, also writing the saved states into `saved` (saved_size >=
 * kla_saved_states_size bytes, 16-byte aligned, on the device; like the workspace, it must not
 * overlap the call's tensors). The outputs are those of kla_chunk_forward on the path and slice
 * it runs (above; the same kernels, bitwise). */
KLA_API kla_status kla_chunk_forward_saving(const kla_params* p, void* saved, size_t saved_size,
                                            kla_stream_t stream);
/* kla_chunk_backward reading each chunk's S and U from `saved`, written by kla_chunk_forward_saving
 * with p->forward's params (the same inputs), instead of recomputing them: the same gradients'
 * contract, without the state scan. The call must be one that can save (kla_saved_states_size of
 * p->forward nonzero). */
KLA_API kla_status kla_chunk_backward_saved(const kla_backward_params* p, const void* saved,
                                            size_t saved_size, kla_stream_t stream);
/* How the saved backward forms the state gradient dS at every chunk boundary (docs/architecture.md
 * "Backward"): both give the same gradients' contract, by different schedules.
 *   SCAN:  one sequential scan a (sequence, value head, 32 value columns), the last chunk first;
 *          the prep runs before it, or beside it where the scan's blocks are one wave.
 *   CHAIN: each sequence cut into segments of chain_segment chunks (8, 16, 32, 64 or 128) run in
 *          parallel, each started from zero a certified warm-up window past its end (the decay
 *          forgets the start below the contract's rounding); a head whose window cannot be
 *          certified is left to the scan. sm_90a only (a 9.0 device and this build's sm_90a
 *          image).
 *   AUTO:  CHAIN where it can run, at the segment a model of its time picks; else SCAN.
 * New in ABI 5 after the saved states (as they are): a library without these symbols runs AUTO. */
typedef enum kla_state_grad {
  KLA_STATE_GRAD_AUTO = 0,
  KLA_STATE_GRAD_SCAN = 1,
  KLA_STATE_GRAD_CHAIN = 2
} kla_state_grad;
/* What kla_chunk_backward_saved_as would run (kla_plan_chunk_backward_saved). */
typedef struct kla_backward_plan {
  kla_state_grad state_grad; /* SCAN or CHAIN, never AUTO */
  int32_t chain_segment;     /* CHAIN: chunks a segment; SCAN: 0 */
  int32_t prep_beside;       /* SCAN: 1 where the prep runs beside the scan; CHAIN: 0 */
  char reason[256];          /* why this schedule; for AUTO choosing SCAN, why CHAIN declined */
} kla_backward_plan;
/* The plan of the saved backward for p on the current device (or `device`: no GPU needed), with
 * state_grad (a kla_state_grad value, passed as int32_t so that any int a caller passes is
 * defined and refused by value) and chain_segment (0 = the plan's choice; nonzero needs CHAIN) as
 * requested. A request that cannot run is KLA_ERROR_UNSUPPORTED_PATH saying why; a value outside
 * the enum or the segments above, KLA_ERROR_INVALID_VALUE. p is validated as by
 * kla_validate_backward, and p->forward must be a call that can save (kla_saved_states_size
 * nonzero). */
KLA_API kla_status kla_plan_chunk_backward_saved(const kla_backward_params* p, int32_t state_grad,
                                                 int32_t chain_segment, kla_backward_plan* plan);
KLA_API kla_status kla_plan_chunk_backward_saved_for(const kla_backward_params* p,
                                                     const kla_device_info* device,
                                                     int32_t state_grad, int32_t chain_segment,
                                                     kla_backward_plan* plan);
/* kla_chunk_backward_saved on the schedule requested (kla_chunk_backward_saved is this with AUTO
 * and 0); refused, nothing written, where kla_plan_chunk_backward_saved refuses. */
KLA_API kla_status kla_chunk_backward_saved_as(const kla_backward_params* p, const void* saved,
                                               size_t saved_size, int32_t state_grad,
                                               int32_t chain_segment, kla_stream_t stream);

KLA_API const char* kla_status_string(kla_status s);
/* The message of the last failing call on this thread ("" if none). Valid until the next call
 * on this thread. */
KLA_API const char* kla_last_error_message(void);
/* "major.minor.patch" of the library. */
KLA_API const char* kla_version_string(void);
/* KLA_ABI_VERSION as the library was built: bindings compare it with their own at load. */
KLA_API uint32_t kla_abi_version(void);
/* The name of a path ("auto", "wy", ...; "unknown" for other values). */
KLA_API const char* kla_path_name(kla_path path);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KLA_KLA_H_ */
