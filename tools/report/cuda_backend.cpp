// CUDA columns of the precision report (issue 4, GPU part): the kla::cuda kernels run through
// their C ABI (cuda/include/kla/kla.h, docs/api.md) on the report's problems.
//
// One column per dtype (cuda-fp32, cuda-bf16, cuda-fp16) under arithmetic ACCURATE, and two under
// FAST (cuda-bf16-fast, cuda-fp16-fast: kla_params.arithmetic = FAST, pinned to the transposed
// scan, the one path with FAST arithmetic for bf16 / fp16; chunk64/raw only, no trace; modelled by
// the CPU columns <dt>-fast-model of arith_models.cpp). The problem's inputs are already rounded to
// the column's storage dtype, so copying them to the device in that dtype is exact; η goes in fp32
// (exact), α as the ABI's log decay g = ln α in fp32 (the only input the ABI itself rounds). The
// runs use the Kaczmarz coefficient from the raw keys and the read-out o = Sᵀq with scale 1, and
// come back as doubles: o from the storage dtype the kernel writes it in, the final state from
// fp32. Head dimensions are zero-padded, the key dimension to at least 64 (so that bf16 / fp16
// prefill takes the production WY path of Hopper GPUs, whose key dims are 64 / 96 / 128;
// docs/api.md) and both to a multiple of 16 (the kernels' granularity; the FAST columns: dk to 64
// or 128 and dv to a multiple of 64, the transposed scan's shapes): zero key, query and value
// components contribute exact zeros to every product and leave the padded state rows and columns at
// 0, so the padded run is the same computation on the same values.
//
// Built with kla::cuda when the CMake option KLA_REPORT_CUDA is on (KLA_REPORT_CUDA=1 defined);
// otherwise make_cuda_backends() only says why there are no CUDA columns.
#include <cmath>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.hpp"

#if KLA_REPORT_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstring>

#include "kla/kla.h"
#endif

namespace kla::report {

#if KLA_REPORT_CUDA

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA column: ") + what + ": " + cudaGetErrorString(e));
}

/// A device allocation, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    if (bytes) check_cuda(cudaMalloc(&p_, bytes), "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (p_) (void)cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

void to_device(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s), "copy to device");
}
void to_host(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), "copy to host");
  check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

int pad16(int n) {
  return (n + 15) / 16 * 16;
}
/// Key dim as run: at least 64 (see the file comment), a multiple of 16.
int pad_key(int n) {
  return n <= 64 ? 64 : pad16(n);
}
/// The transposed scan's head dims (plan/paths.cpp): key 64 or 128, value a multiple of 64.
constexpr int kFastMaxHeadDim = 128;
int pad_key_fast(int n) {
  return n <= 64 ? 64 : 128;
}
int pad_value_fast(int n) {
  return (n + 63) / 64 * 64;
}

size_t dtype_bytes(kla_dtype d) {
  return d == KLA_DTYPE_FP32 ? 4 : 2;
}

/// x (a value of the dtype) in the dtype's storage at `dst`; exact for storage-rounded inputs.
void encode(kla_dtype d, double x, unsigned char* dst) {
  const float f = float(x);
  if (d == KLA_DTYPE_FP32) {
    std::memcpy(dst, &f, 4);
  } else if (d == KLA_DTYPE_BF16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(f);
    std::memcpy(dst, &h, 2);
  } else {
    const __half h = __float2half_rn(f);
    std::memcpy(dst, &h, 2);
  }
}

double decode(kla_dtype d, const unsigned char* src) {
  if (d == KLA_DTYPE_FP32) {
    float f;
    std::memcpy(&f, src, 4);
    return f;
  }
  if (d == KLA_DTYPE_BF16) {
    __nv_bfloat16 h;
    std::memcpy(&h, src, 2);
    return __bfloat162float(h);
  }
  __half h;
  std::memcpy(&h, src, 2);
  return __half2float(h);
}

/// rows x cols of `x` (row-major) into rows x cols_p storage bytes, zero-padded.
std::vector<unsigned char> pack(kla_dtype d, const std::vector<double>& x, int rows, int cols,
                                int cols_p) {
  const size_t es = dtype_bytes(d);
  std::vector<unsigned char> out(size_t(rows) * cols_p * es, 0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      encode(d, x[size_t(r) * cols + c], &out[(size_t(r) * cols_p + c) * es]);
  return out;
}

/// A state [Kp, Vp] in fp32 as the report's [dk, dv] doubles.
std::vector<double> unpad_state(const std::vector<float>& s, int dk, int dv, int Vp) {
  std::vector<double> out(size_t(dk) * dv);
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) out[size_t(i) * dv + j] = s[size_t(i) * Vp + j];
  return out;
}

std::string last_error(kla_status st) {
  return std::string(kla_status_string(st)) + ": " + kla_last_error_message();
}

/// The device-side inputs of one problem (padded, in the column's dtype), shared by run() and
/// trace().
struct DeviceInputs {
  int T, dk, dv, Kp, Vp;
  kla_dtype dtype;
  DeviceBuffer q, k, v, eta, g;

  DeviceInputs(const Problem& p, kla_dtype d, bool fast, cudaStream_t s)
      : T(p.T),
        dk(p.dk),
        dv(p.dv),
        Kp(fast ? pad_key_fast(p.dk) : pad_key(p.dk)),
        Vp(fast ? pad_value_fast(p.dv) : pad16(p.dv)),
        dtype(d),
        q(size_t(p.T) * Kp * dtype_bytes(d)),
        k(size_t(p.T) * Kp * dtype_bytes(d)),
        v(size_t(p.T) * Vp * dtype_bytes(d)),
        eta(size_t(p.T) * 4),
        g(p.alpha.empty() ? 0 : size_t(p.T) * 4) {
    hq = pack(d, p.q, T, dk, Kp);
    hk = pack(d, p.k, T, dk, Kp);
    hv = pack(d, p.v, T, dv, Vp);
    heta.assign(p.eta.begin(), p.eta.end());
    for (double a : p.alpha) hg.push_back(float(std::log(a)));
    to_device(q.get(), hq.data(), hq.size(), s);
    to_device(k.get(), hk.data(), hk.size(), s);
    to_device(v.get(), hv.data(), hv.size(), s);
    to_device(eta.get(), heta.data(), heta.size() * 4, s);
    if (!hg.empty()) to_device(g.get(), hg.data(), hg.size() * 4, s);
  }

  /// Parameters of a call over tokens [t0, t0 + n) of the one sequence (B = H = HV = 1).
  kla_params params(int t0, int n, double eps, bool decay) const {
    kla_params p;
    kla_params_init(&p);
    const size_t es = dtype_bytes(dtype);
    p.dtype = dtype;
    p.batch = 1;
    p.seq_len = n;
    p.num_heads = p.num_v_heads = 1;
    p.head_dim_k = Kp;
    p.head_dim_v = Vp;
    p.q = q.as<unsigned char>() + size_t(t0) * Kp * es;
    p.k = k.as<unsigned char>() + size_t(t0) * Kp * es;
    p.v = v.as<unsigned char>() + size_t(t0) * Vp * es;
    for (int64_t* st : {p.q_strides, p.k_strides}) st[0] = int64_t(n) * Kp, st[1] = st[2] = Kp;
    for (int64_t* st : {p.v_strides, p.o_strides}) st[0] = int64_t(n) * Vp, st[1] = st[2] = Vp;
    p.eta = eta.as<float>() + t0;
    p.eta_strides[0] = n;
    p.eta_strides[1] = 1;
    if (decay && g.get()) {
      p.g = g.as<float>() + t0;
      p.g_strides[0] = n;
      p.g_strides[1] = 1;
    }
    p.eps = float(eps);
    p.scale = 1.0f;
    p.coefficient = KLA_COEFF_KACZMARZ;
    p.readout = KLA_READOUT_SCALE;
    // One pass: the chunk columns measure the chunkwise kernels' arithmetic. At one sequence and
    // one value head the plan would split sequences of 8192 tokens or more (kla_params.segments),
    // another algorithm, checked against MPFR by CudaKernels.SequenceSplitAgainstMpfr.
    p.segments = 1;
    return p;
  }

  std::vector<unsigned char> hq, hk, hv;
  std::vector<float> heta, hg;
};

/// A CUDA column: one dtype under one arithmetic. ACCURATE columns run both entry points and
/// trace; FAST columns run kla_chunk_forward on the transposed scan only.
class CudaBackend final : public Backend {
 public:
  CudaBackend(kla_dtype d, Storage s, std::string name, bool fast)
      : dtype_(d), storage_(s), name_(name), fast_(fast) {}
  std::string id() const override { return "cuda-" + name_ + (fast_ ? "-fast" : ""); }
  Storage storage() const override { return storage_; }
  DtypeSpec dtypes() const override {
    if (fast_)
      return {name_,
              "fp32",
              "fp32",
              "fp32 (Kaczmarz, from the raw keys)",
              "fp32",
              "kla::cuda kernels through the C ABI under arithmetic FAST (kla_params.arithmetic; "
              "the state and its update rounded once to " +
                  name_ +
                  " in their tensor-core products): chunk64/raw = kla_chunk_forward pinned to the "
                  "transposed scan (kla_params.path = WY_TRANSPOSED, the path with FAST for " +
                  name_ + "; the plan is checked to run FAST there); o written in " + name_ +
                  ", final state in fp32; head dims padded with zeros (exact): dk to 64 or 128, "
                  "dv to a multiple of 64"};
    return {name_,
            "fp32",
            "fp32",
            "fp32 (Kaczmarz, from the raw keys)",
            "fp32",
            "kla::cuda kernels through the C ABI: tokenwise/raw = kla_tokenwise_forward (one call "
            "of T tokens), chunk64/raw = kla_chunk_forward (chunks of 64, with workspace, one "
            "pass: segments = 1); o "
            "written in " +
                name_ +
                ", final state in fp32; alpha passed as g = ln(alpha) in fp32; head dims padded "
                "with zeros (exact): dk to at least 64 (the WY prefill path on Hopper), both to a "
                "multiple of 16"};
  }
  double unit_roundoff() const override { return std::ldexp(1.0, -24); }
  bool supports(const Algo& a) const override {
    return !a.normalized && (a.chunked ? a.chunk == 64 : !fast_);
  }
  std::string algo_name(const Algo& a) const override {
    return a.chunked ? (fast_ ? "chunk kernel FAST" : "chunk kernel") : "token kernel";
  }
  std::string model_id() const override {
    if (fast_) return name_ + "-fast-model";
    return name_ == "fp32" ? "fp32" : name_ + "-store";
  }
  bool has_trace() const override { return !fast_; }
  double stored_eps(double eps) const override { return double(float(eps)); }
  std::string trace_note() const override {
    return "The CUDA columns expose no per-token state inside a call, so their per-token trace "
           "is a chain of one-token calls of kla_tokenwise_forward: token t starts from the "
           "initial state S~ = fl32(alpha_t S_{t-1}), decayed on the host (one fp32 multiply "
           "per entry, no g passed), and its final state is S_t. Every write step, the part these "
           "sections examine, is the kernel's own; only the decay multiply is the host's.";
  }

  RunResult run(const Problem& p, double eps, const Algo& a) const override {
    if (!supports(a)) throw std::logic_error(id() + " does not run " + a.label());
    if (fast_ && (p.dk > kFastMaxHeadDim || p.dv > kFastMaxHeadDim))
      throw std::runtime_error(id() + ": head dims up to " + std::to_string(kFastMaxHeadDim) +
                               " (the transposed scan's), got dk = " + std::to_string(p.dk) +
                               ", dv = " + std::to_string(p.dv));
    cudaStream_t s = cudaStreamPerThread;
    const DeviceInputs in(p, dtype_, fast_, s);
    const size_t es = dtype_bytes(dtype_);
    DeviceBuffer o(size_t(p.T) * in.Vp * es), S(size_t(in.Kp) * in.Vp * 4);
    kla_params prm = in.params(0, p.T, eps, true);
    prm.o = o.get();
    prm.final_state = S.as<float>();
    std::unique_ptr<DeviceBuffer> ws;
    kla_status st;
    if (a.chunked) {
      if (fast_) {
        prm.arithmetic = KLA_ARITHMETIC_FAST;
        prm.path = KLA_PATH_WY_TRANSPOSED;
      }
      prm.workspace_size = kla_workspace_size(&prm);
      ws = std::make_unique<DeviceBuffer>(prm.workspace_size);
      prm.workspace = ws->get();
      if (fast_) {  // a column named FAST runs FAST, or the report stops
        kla_plan plan;
        const kla_status ps = kla_plan_chunk_forward(&prm, &plan);
        if (ps != KLA_SUCCESS) throw std::runtime_error(id() + " plan: " + last_error(ps));
        if (plan.arithmetic != KLA_ARITHMETIC_FAST || plan.path != KLA_PATH_WY_TRANSPOSED)
          throw std::runtime_error(
              id() + ": the plan does not run FAST on the transposed scan: " + plan.reason);
      }
      st = kla_chunk_forward(&prm, reinterpret_cast<kla_stream_t>(s));
    } else {
      st = kla_tokenwise_forward(&prm, reinterpret_cast<kla_stream_t>(s));
    }
    // An ABI error is a bug of this program, not a property of the data: fail the report.
    if (st != KLA_SUCCESS) throw std::runtime_error(id() + " " + a.label() + ": " + last_error(st));
    std::vector<unsigned char> ho(size_t(p.T) * in.Vp * es);
    std::vector<float> hs(size_t(in.Kp) * in.Vp);
    to_host(ho.data(), o.get(), ho.size(), s);
    to_host(hs.data(), S.get(), hs.size() * 4, s);
    RunResult r;
    r.o.resize(size_t(p.T) * p.dv);
    for (int t = 0; t < p.T; ++t)
      for (int j = 0; j < p.dv; ++j)
        r.o[size_t(t) * p.dv + j] = decode(dtype_, &ho[(size_t(t) * in.Vp + j) * es]);
    r.state = unpad_state(hs, p.dk, p.dv, in.Vp);
    return r;
  }

  std::optional<std::vector<TokenRecord>> trace(const Problem& p, double eps) const override {
    if (fast_) return std::nullopt;  // FAST has no tokenwise kernel to chain
    cudaStream_t s = cudaStreamPerThread;
    const DeviceInputs in(p, dtype_, false, s);
    const size_t n_state = size_t(in.Kp) * in.Vp;
    DeviceBuffer o(size_t(in.Vp) * dtype_bytes(dtype_)), S0(n_state * 4), S1(n_state * 4);
    std::vector<float> S(n_state, 0.0f), decayed(n_state);
    std::vector<TokenRecord> recs;
    recs.reserve(size_t(p.T));
    for (int t = 0; t < p.T; ++t) {
      const float alpha = p.alpha.empty() ? 1.0f : float(p.alpha[size_t(t)]);
      for (size_t i = 0; i < n_state; ++i) decayed[i] = alpha * S[i];
      to_device(S0.get(), decayed.data(), n_state * 4, s);
      kla_params prm = in.params(t, 1, eps, false);
      prm.o = o.get();
      prm.initial_state = S0.as<float>();
      prm.final_state = S1.as<float>();
      const kla_status st = kla_tokenwise_forward(&prm, reinterpret_cast<kla_stream_t>(s));
      if (st != KLA_SUCCESS) throw std::runtime_error(id() + " trace: " + last_error(st));
      to_host(S.data(), S1.get(), n_state * 4, s);
      recs.push_back({unpad_state(decayed, p.dk, p.dv, in.Vp), unpad_state(S, p.dk, p.dv, in.Vp)});
    }
    return recs;
  }

 private:
  kla_dtype dtype_;
  Storage storage_;
  std::string name_;
  bool fast_;
};

std::string version(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

}  // namespace

std::vector<std::unique_ptr<Backend>> make_cuda_backends(CudaStatus& st, int max_head_dim) {
  st = CudaStatus{};
  st.compiled = true;
  std::vector<std::unique_ptr<Backend>> b;
  if (const char* env = std::getenv("KLA_REPORT_CUDA"); env && std::string(env) == "0") {
    st.why = "CUDA columns disabled by KLA_REPORT_CUDA=0";
    return b;
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    st.why = std::string("no CUDA device (") +
             (e != cudaSuccess ? cudaGetErrorString(e) : "device count 0") + ")";
    return b;
  }
  int dev = 0, driver = 0, runtime = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    st.why = "a CUDA device exists but its properties cannot be read";
    return b;
  }
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  std::ostringstream dv;
  dv << prop.name << ", " << prop.multiProcessorCount << " SMs, compute capability " << prop.major
     << "." << prop.minor << ", " << (prop.totalGlobalMem + (size_t(1) << 29)) / (size_t(1) << 30)
     << " GiB";
  st.device = dv.str();
  st.versions = "CUDA driver " + version(driver) + ", runtime " + version(runtime) +
                " (kla_report built against " + version(CUDART_VERSION) + "), kla::cuda " +
                kla_version_string();
  b.push_back(std::make_unique<CudaBackend>(KLA_DTYPE_FP32, Storage::fp32, "fp32", false));
  b.push_back(std::make_unique<CudaBackend>(KLA_DTYPE_BF16, Storage::bf16, "bf16", false));
  b.push_back(std::make_unique<CudaBackend>(KLA_DTYPE_FP16, Storage::fp16, "fp16", false));
  if (max_head_dim <= kFastMaxHeadDim) {
    b.push_back(std::make_unique<CudaBackend>(KLA_DTYPE_BF16, Storage::bf16, "bf16", true));
    b.push_back(std::make_unique<CudaBackend>(KLA_DTYPE_FP16, Storage::fp16, "fp16", true));
  } else {
    st.note = "no FAST columns: head dims up to " + std::to_string(max_head_dim) +
              " exceed the transposed scan's " + std::to_string(kFastMaxHeadDim);
  }
  // A smoke call per column and entry point: a device the kernels were not built for (no
  // kernel image) gives no columns and a reason, not a report full of errors.
  Problem p;
  p.T = 2;
  p.dk = p.dv = 1;
  p.q = p.k = p.v = {1.0, 0.5};
  p.eta = {1.0, 1.0};
  try {
    for (const auto& c : b)
      for (bool chunked : {false, true})
        if (c->supports(Algo{chunked, 64, false})) (void)c->run(p, 1e-6, Algo{chunked, 64, false});
  } catch (const std::exception& ex) {
    st.why = "the kernels failed a smoke call on " + st.device + ": " + ex.what();
    b.clear();
    return b;
  }
  st.available = true;
  return b;
}

#else  // no CUDA backend in this build

std::vector<std::unique_ptr<Backend>> make_cuda_backends(CudaStatus& st, int max_head_dim) {
  st = CudaStatus{};
  (void)max_head_dim;
  st.why =
      "this kla_report has no CUDA backend (configure with -DKLA_REPORT_CUDA=ON, "
      "which needs kla::cuda)";
  return {};
}

#endif

}  // namespace kla::report
