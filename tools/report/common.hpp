// Shared vocabulary of the precision report (tools/kla_report.cpp): problems, storage dtypes,
// algorithms, run results and the backend interface through which every column is computed.
//
// Invariant that the whole report rests on: a Problem holds doubles that are already exactly
// representable in its storage dtype, so every backend (and the MPFR ground truth) reads the
// very same input values; the error of a column is then the error of its arithmetic alone.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace kla::report {

/// The dtype inputs are stored in (q, k, v, η and α alike; see report.md §1 for why α and η are
/// rounded too: it lets every column of one storage dtype share a single ground truth).
enum class Storage { fp64, fp32, bf16, fp16 };

std::string storage_name(Storage s);
/// Rounds x to the nearest value of the storage dtype (ties to even), returned as a double.
double round_to(Storage s, double x);
/// Smallest positive normal number of the dtype (fp16: 2^-14; bf16 and fp32 share FLT_MIN).
double min_normal(Storage s);

/// One head's inputs, row-major: q, k [T, dk], v [T, dv], eta [T], alpha [T] (empty = no decay).
struct Problem {
  int T = 0, dk = 0, dv = 0;
  std::vector<double> q, k, v, eta, alpha;
  /// A copy with every input rounded to `s` (α, η included).
  Problem rounded(Storage s) const;
};

/// Which algorithm a run uses: tokenwise or chunkwise order, raw keys or the normalised-key
/// form (k̂ = k/r, v̂ = v/r, β = η; SPEC §1).
struct Algo {
  bool chunked = false;
  int chunk = 64;
  bool normalized = false;
  /// e.g. "tokenwise/raw", "chunk64/normalized"
  std::string label() const {
    return (chunked ? "chunk" + std::to_string(chunk) : std::string("tokenwise")) +
           (normalized ? "/normalized" : "/raw");
  }
};

/// Outputs o [T, dv] and final state S [dk, dv], as doubles (every dtype converts exactly).
struct RunResult {
  std::vector<double> o, state;
  std::string error;  ///< non-empty when the run threw (counted as all-NaN)
};

/// One token of a tokenwise raw-form run, for the per-token analyses (§3, §7): the decayed
/// state S̃ and the new state S_t exactly as the backend held them.
struct TokenRecord {
  std::vector<double> decayed, state;
};

/// The dtypes a column uses, for the report's column legend.
struct DtypeSpec {
  std::string storage, state, accumulation, coefficient, eps, note;
};

/// A column of the report. The CPU build provides the reference instantiated in float and in
/// emulated bf16/fp16; the CUDA columns (cuda_backend.cpp) run the kla::cuda kernels. Every
/// column receives the same storage-rounded problem and returns o and the final state, and may
/// decline the per-token trace.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string id() const = 0;
  virtual Storage storage() const = 0;
  virtual DtypeSpec dtypes() const = 0;
  /// Unit roundoff of the arithmetic (for the guide lines of §4).
  virtual double unit_roundoff() const = 0;
  virtual bool supports(const Algo&) const { return true; }
  /// Runs the problem (already rounded to storage()) with stabiliser eps (a float parameter,
  /// as in the kernels' ABI: the backend rounds it to whatever type it computes β in).
  virtual RunResult run(const Problem& p, double eps, const Algo& a) const = 0;
  /// Tokenwise raw-form trace, or nullopt when the backend cannot expose its state per token.
  virtual std::optional<std::vector<TokenRecord>> trace(const Problem& p, double eps) const = 0;
  /// eps as the backend's β computation sees it.
  virtual double stored_eps(double eps) const = 0;
  /// False when trace() always declines: the per-token sections (§3, §7) then leave it out.
  virtual bool has_trace() const { return true; }
  /// How trace() obtains the per-token states when that is not obvious (the report's text).
  virtual std::string trace_note() const { return ""; }
  /// Id of the CPU column whose arithmetic models this one ("" for the CPU columns themselves).
  virtual std::string model_id() const { return ""; }
  /// How the report names run `a` of this column where the algorithm label alone is ambiguous
  /// (the CUDA columns: which entry point ran).
  virtual std::string algo_name(const Algo& a) const { return a.label(); }
};

/// CPU columns: fp32, bf16-emul, bf16-store, fp16-emul, fp16-store (in that order).
std::vector<std::unique_ptr<Backend>> make_cpu_backends();

/// CPU columns modelling the chunkwise kernels' tensor-core arithmetics (arith_models.cpp):
/// bf16-fast-model, bf16-onepart-model, fp16-fast-model, fp16-onepart-model (chunk64/raw only).
std::vector<std::unique_ptr<Backend>> make_arithmetic_models();

/// What the CUDA columns run on, for the provenance.
struct CudaStatus {
  bool compiled = false;   ///< this kla_report links kla::cuda (CMake option KLA_REPORT_CUDA)
  bool available = false;  ///< a usable device was found at run time: the columns are registered
  std::string device;      ///< e.g. "NVIDIA H200, 132 SMs, compute capability 9.0, 140 GiB"
  std::string versions;    ///< driver, runtime and toolkit versions, kla::cuda version
  std::string why;         ///< why there are no CUDA columns (when !available)
  std::string note;        ///< why some CUDA columns are missing (the FAST ones), or ""
};

/// CUDA columns cuda-fp32, cuda-bf16, cuda-fp16: the kla::cuda kernels through the C ABI, one
/// column per dtype, tokenwise/raw running kla_tokenwise_forward and chunk64/raw running
/// kla_chunk_forward (Kaczmarz coefficient); then cuda-bf16-fast, cuda-fp16-fast (arithmetic
/// FAST on the transposed scan, chunk64/raw only) when the report's head dims are at most
/// max_head_dim <= 128 (else `st.note` says why not). Empty, with `st.why` set, when this build
/// has no CUDA backend, when no CUDA device is present at run time, or when KLA_REPORT_CUDA=0 is
/// set in the environment.
std::vector<std::unique_ptr<Backend>> make_cuda_backends(CudaStatus& st, int max_head_dim);

/// Every column of the report: the CPU columns, the arithmetic models, then the CUDA columns
/// where available (max_head_dim: the largest head dim the report runs).
std::vector<std::unique_ptr<Backend>> make_backends(CudaStatus& st, int max_head_dim);

// ---- ground truth (truth.cpp) -----------------------------------------------------------------

/// Significand bits of the ground truth (those of kla::ref::Mpfr).
int truth_bits();
/// Tokenwise raw-form KLA in MPFR with the given eps (taken as exact), Kaczmarz coefficient,
/// read-out o_t = S_tᵀ q_t. A direct in-place MPFR loop: ~20x faster than the reference's
/// Eigen-over-Boost Mpfr, and cross-checked against it and against exact rationals (§1).
RunResult truth_forward(const Problem& p, double eps);
/// kla::ref::recurrent_forward / chunk_forward in Mpfr and in Rational, for the cross-check.
RunResult reference_mpfr(const Problem& p, double eps, const Algo& a);
RunResult reference_rational(const Problem& p, double eps);

/// Compares L(S_b) with L(S_a), L(S) = ½‖Sᵀk − v‖², in MPFR (exact for float-valued states up
/// to 2^-truth_bits). Returns L(S_b)/L(S_a) (0/0 = 1), sets `cmp` to sign(L(S_b) − L(S_a)) and
/// `a_zero` when L(S_a) = 0 (nothing left to decrease).
double loss_ratio(const double* Sa, const double* Sb, const double* k, const double* v, int dk,
                  int dv, int& cmp, bool& a_zero);

/// Interpolation defect of one token over exact rationals (§3): with S̃ and S_t as given,
/// returns ‖S_tᵀk − f‖ / ‖f‖ where f = (η‖k‖²/(‖k‖²+ε)) v + (1 − η‖k‖²/(‖k‖²+ε)) S̃ᵀk, and the
/// exact weight ε/(‖k‖²+ε) in `eps_weight`. With exact=true it also runs the exact step from
/// S̃ and returns its defect instead (which must be 0).
double interpolation_defect(const double* decayed, const double* state, const double* k,
                            const double* v, double eta, double eps, int dk, int dv,
                            double& eps_weight, bool exact_step);

// ---- small utilities ------------------------------------------------------------------------

/// Deterministic per-item seed, independent of thread scheduling.
inline std::uint64_t mix_seed(std::uint64_t base, std::uint64_t a, std::uint64_t b = 0,
                              std::uint64_t c = 0) {
  std::uint64_t x = base * 0x9E3779B97F4A7C15ull ^ (a + 0x632BE59BD9B4E019ull);
  for (std::uint64_t y : {b, c}) {
    x ^= y + 0x9E3779B97F4A7C15ull + (x << 6) + (x >> 2);
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
  }
  return x;
}

}  // namespace kla::report
