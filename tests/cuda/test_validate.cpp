// Host-side validation of kla_params (runs everywhere, no GPU needed): every class of bad input
// returns its status and a message naming the argument, and the entry points write nothing
// (o and final_state here are host buffers filled with a sentinel that must survive).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kla/kla.h"
#include "kla/kla.hpp"

#ifdef KLA_TEST_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

constexpr int B = 2, T = 5, H = 2, HV = 4, K = 32, V = 64;

struct Fixture {
  std::vector<float> q, k, v, o, g, eta, s0, sf;
  std::vector<int32_t> cu, cu_dev_stand_in, idx;
  kla_params p;

  // Head dims kd, vd (the file's K, V unless given: the saved-states tests take 128).
  explicit Fixture(int kd = K, int vd = V) {
    q.assign(B * T * H * kd + 64, 1.0f);
    k = q;
    v.assign(B * T * HV * vd + 64, 1.0f);
    o.assign(B * T * HV * vd + 64, 12345.0f);
    g.assign(B * T * HV, -0.1f);
    eta.assign(B * T * HV, 1.0f);
    s0.assign(B * HV * kd * vd + 64, 0.5f);
    sf.assign(B * HV * kd * vd + 64, 12345.0f);
    kla_params_init(&p);
    p.dtype = KLA_DTYPE_FP32;
    p.batch = B, p.seq_len = T, p.num_heads = H, p.num_v_heads = HV;
    p.head_dim_k = kd, p.head_dim_v = vd;
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.o = o.data();
    const int64_t qs[3] = {T * H * kd, H * kd, kd}, vs[3] = {T * HV * vd, HV * vd, vd};
    for (int i = 0; i < 3; ++i) {
      p.q_strides[i] = p.k_strides[i] = qs[i];
      p.v_strides[i] = p.o_strides[i] = vs[i];
    }
    p.g = g.data(), p.eta = eta.data();
    p.g_strides[0] = p.eta_strides[0] = T * HV;
    p.g_strides[1] = p.eta_strides[1] = HV;
    p.initial_state = s0.data();
    p.final_state = sf.data();
  }
  bool untouched() const {
    for (float x : o)
      if (x != 12345.0f) return false;
    for (float x : sf)
      if (x != 12345.0f) return false;
    return true;
  }
};

#ifdef KLA_TEST_WITH_CUDA
bool have_gpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  return ok;
}
#endif

/// H100 / H200 as the plan sees them (kla_plan_chunk_forward_for needs no GPU).
constexpr kla_device_info kH200{9, 0, 132, 232448, 1};

/// Expects `st` from kla_validate, the planners and both entry points, a message containing
/// `needle`, and nothing written (neither the outputs nor the plan).
void expect_rejected(Fixture& f, kla_status st, const std::string& needle) {
  EXPECT_EQ(kla_validate(&f.p), st) << kla_last_error_message();
  EXPECT_NE(std::string(kla_last_error_message()).find(needle), std::string::npos)
      << "message '" << kla_last_error_message() << "' does not name '" << needle << "'";
  kla_plan plan, untouched_plan;
  std::memset(&plan, 0x5A, sizeof plan);
  std::memset(&untouched_plan, 0x5A, sizeof untouched_plan);
  EXPECT_EQ(kla_plan_chunk_forward_for(&f.p, &kH200, &plan), st);
  EXPECT_NE(std::string(kla_last_error_message()).find(needle), std::string::npos);
#ifdef KLA_TEST_WITH_CUDA
  EXPECT_EQ(kla_plan_chunk_forward(&f.p, &plan), st);
  EXPECT_NE(std::string(kla_last_error_message()).find(needle), std::string::npos);
  EXPECT_EQ(kla_plan_tokenwise_forward(&f.p, &plan), st);
  EXPECT_NE(std::string(kla_last_error_message()).find(needle), std::string::npos);
  EXPECT_EQ(kla_chunk_forward(&f.p, nullptr), st);
  EXPECT_NE(std::string(kla_last_error_message()).find(needle), std::string::npos);
  EXPECT_EQ(kla_tokenwise_forward(&f.p, nullptr), st);
  EXPECT_NE(std::string(kla_last_error_message()).find(needle), std::string::npos);
#endif
  EXPECT_EQ(std::memcmp(&plan, &untouched_plan, sizeof plan), 0) << "a refused call wrote the plan";
  EXPECT_TRUE(f.untouched());
}

TEST(Validate, AcceptsAValidProblem) {
  Fixture f;
  EXPECT_EQ(kla_validate(&f.p), KLA_SUCCESS) << kla_last_error_message();
  EXPECT_STREQ(kla_last_error_message(), "");
  f.p.final_state = const_cast<float*>(f.p.initial_state);  // in place is allowed
  EXPECT_EQ(kla_validate(&f.p), KLA_SUCCESS) << kla_last_error_message();
  f.p.g = nullptr, f.p.eta = nullptr, f.p.initial_state = nullptr, f.p.final_state = nullptr;
  EXPECT_EQ(kla_validate(&f.p), KLA_SUCCESS) << kla_last_error_message();
}

TEST(Validate, NullPointers) {
  EXPECT_EQ(kla_validate(nullptr), KLA_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(kla_last_error_message()).find("params"), std::string::npos);
  for (const char* name : {"q", "k", "v", "o"}) {
    Fixture f;
    if (!std::strcmp(name, "q")) f.p.q = nullptr;
    if (!std::strcmp(name, "k")) f.p.k = nullptr;
    if (!std::strcmp(name, "v")) f.p.v = nullptr;
    if (!std::strcmp(name, "o")) f.p.o = nullptr;
    expect_rejected(f, KLA_ERROR_NULL_POINTER, std::string(name) + " is NULL");
  }
}

TEST(Validate, NonPositiveSizes) {
  const char* names[] = {"batch",       "seq_len",    "num_heads",
                         "num_v_heads", "head_dim_k", "head_dim_v"};
  for (int i = 0; i < 6; ++i)
    for (int64_t bad : {0, -3}) {
      Fixture f;
      int64_t* fields[] = {&f.p.batch,       &f.p.seq_len,    &f.p.num_heads,
                           &f.p.num_v_heads, &f.p.head_dim_k, &f.p.head_dim_v};
      *fields[i] = bad;
      expect_rejected(f, KLA_ERROR_INVALID_SIZE, names[i]);
    }
}

// The kernels index sequences, tokens and heads with 32-bit integers: a larger size is refused,
// never narrowed (batch = 2^32 + 1 used to pass and run as batch 1).
TEST(Validate, SizesTheKernelsNarrow) {
  const int64_t big = (int64_t(1) << 32) + 1;
  {
    Fixture f;
    f.p.batch = big;
    expect_rejected(f, KLA_ERROR_INVALID_SIZE, "batch = 4294967297 exceeds 2^31-1");
  }
  {
    Fixture f;
    f.p.num_heads = f.p.num_v_heads = big;
    expect_rejected(f, KLA_ERROR_INVALID_SIZE, "num_heads = 4294967297 exceeds 2^31-1");
  }
  {
    Fixture f;
    f.p.num_heads = 1, f.p.num_v_heads = big;
    expect_rejected(f, KLA_ERROR_INVALID_SIZE, "num_v_heads = 4294967297 exceeds 2^31-1");
  }
  {
    Fixture f;
    f.p.seq_len = big;
    expect_rejected(f, KLA_ERROR_INVALID_SIZE, "seq_len = 4294967297 exceeds 2^31-1");
  }
}

TEST(Validate, GroupedHeadsMustDivide) {
  Fixture f;
  f.p.num_v_heads = 3;
  expect_rejected(f, KLA_ERROR_SHAPE_MISMATCH, "num_v_heads");
}

TEST(Validate, UnsupportedHeadDimsAndDtype) {
  for (int64_t d : {8, 72, 100, 272}) {
    Fixture f;
    f.p.head_dim_k = d;
    expect_rejected(f, KLA_ERROR_UNSUPPORTED_HEAD_DIM, "head_dim_k");
    Fixture f2;
    f2.p.head_dim_v = d;
    expect_rejected(f2, KLA_ERROR_UNSUPPORTED_HEAD_DIM, "head_dim_v");
  }
  Fixture f;
  f.p.dtype = static_cast<kla_dtype>(7);
  expect_rejected(f, KLA_ERROR_UNSUPPORTED_DTYPE, "dtype");
}

TEST(Validate, AlignmentAndStrides) {
  {
    Fixture f;
    f.p.q = reinterpret_cast<const char*>(f.q.data()) + 4;
    expect_rejected(f, KLA_ERROR_MISALIGNED, "q is not 16-byte aligned");
  }
  {
    Fixture f;
    f.p.v_strides[1] = HV * V + 1;  // 4 bytes off
    expect_rejected(f, KLA_ERROR_MISALIGNED, "v_strides[1]");
  }
  {
    Fixture f;
    f.p.k_strides[2] = -K;
    expect_rejected(f, KLA_ERROR_BAD_STRIDE, "k_strides[2]");
  }
  {
    Fixture f;
    f.p.o_strides[2] = V / 2;  // heads of o would overlap
    expect_rejected(f, KLA_ERROR_BAD_STRIDE, "o_strides[2]");
  }
  {
    Fixture f;
    f.p.o_strides[0] = 8;  // batch rows of o would overlap
    expect_rejected(f, KLA_ERROR_BAD_STRIDE, "o_strides[0]");
  }
  {
    Fixture f;
    f.p.g_strides[1] = 0;
    expect_rejected(f, KLA_ERROR_BAD_STRIDE, "g_strides[1]");
  }
  {
    Fixture f;
    f.p.initial_state = f.s0.data() + 1;
    expect_rejected(f, KLA_ERROR_MISALIGNED, "initial_state");
  }
}

TEST(Validate, ScalarValues) {
  for (float eps : {-1e-6f, NAN, INFINITY}) {
    Fixture f;
    f.p.eps = eps;
    expect_rejected(f, KLA_ERROR_INVALID_VALUE, "eps");
  }
  {
    Fixture f;
    f.p.scale = INFINITY;
    expect_rejected(f, KLA_ERROR_INVALID_VALUE, "scale");
  }
  {
    Fixture f;
    f.p.eta = nullptr;
    f.p.eta_value = NAN;
    expect_rejected(f, KLA_ERROR_INVALID_VALUE, "eta_value");
  }
  {
    Fixture f;
    f.p.coefficient = static_cast<kla_coefficient>(4);
    expect_rejected(f, KLA_ERROR_INVALID_VALUE, "coefficient");
  }
  {
    Fixture f;
    f.p.readout = static_cast<kla_readout>(-1);
    expect_rejected(f, KLA_ERROR_INVALID_VALUE, "readout");
  }
  {
    Fixture f;
    EXPECT_EQ(f.p.arithmetic, KLA_ARITHMETIC_ACCURATE);  // kla_params_init's default
    f.p.arithmetic = static_cast<kla_arithmetic>(2);
    expect_rejected(f, KLA_ERROR_INVALID_VALUE, "arithmetic");
    f.p.arithmetic = KLA_ARITHMETIC_FAST;
    EXPECT_EQ(kla_validate(&f.p), KLA_SUCCESS) << kla_last_error_message();
  }
}

TEST(Validate, CuSeqlens) {
  auto varlen = [](Fixture& f, std::vector<int32_t> cu) {
    f.cu = std::move(cu);
    f.cu_dev_stand_in = f.cu;
    f.p.batch = 1;
    f.p.seq_len = 10;
    f.p.cu_seqlens = f.cu_dev_stand_in.data();
    f.p.cu_seqlens_host = f.cu.data();
    f.p.num_seqs = int64_t(f.cu.size()) - 1;
    f.p.initial_state = nullptr;
    f.p.final_state = nullptr;
  };
  {
    Fixture f;
    varlen(f, {0, 4, 10});
    EXPECT_EQ(kla_validate(&f.p), KLA_SUCCESS) << kla_last_error_message();
  }
  {
    Fixture f;
    varlen(f, {1, 4, 10});
    expect_rejected(f, KLA_ERROR_BAD_CU_SEQLENS, "cu_seqlens[0]");
  }
  {
    Fixture f;
    varlen(f, {0, 6, 4, 10});
    expect_rejected(f, KLA_ERROR_BAD_CU_SEQLENS, "not monotonic");
  }
  {
    Fixture f;
    varlen(f, {0, 4, 9});
    expect_rejected(f, KLA_ERROR_BAD_CU_SEQLENS, "must equal seq_len");
  }
  {
    Fixture f;
    varlen(f, {0, 4, 10});
    f.p.batch = 2;
    f.p.o_strides[0] = 10 * HV * V;  // keep o non-overlapping: the batch check is what fails
    expect_rejected(f, KLA_ERROR_SHAPE_MISMATCH, "cu_seqlens needs batch = 1");
  }
  {
    Fixture f;
    varlen(f, {0, 4, 10});
    f.p.cu_seqlens_host = nullptr;
    expect_rejected(f, KLA_ERROR_NULL_POINTER, "cu_seqlens_host");
  }
  {
    Fixture f;
    varlen(f, {0, 4, 10});
    f.p.num_seqs = 0;
    expect_rejected(f, KLA_ERROR_INVALID_SIZE, "num_seqs");
  }
  {  // sequences are indexed with 32-bit integers (refused before cu_seqlens_host is read)
    Fixture f;
    varlen(f, {0, 4, 10});
    f.p.num_seqs = int64_t(1) << 31;
    expect_rejected(f, KLA_ERROR_INVALID_SIZE, "num_seqs = 2147483648 exceeds 2^31-1");
  }
}

TEST(Validate, StatePool) {
  auto pooled = [](Fixture& f, std::vector<int32_t> idx, int64_t pool_size) {
    f.idx = std::move(idx);
    f.cu_dev_stand_in = f.idx;
    f.p.initial_state = nullptr;
    f.p.final_state = nullptr;
    f.p.state_pool = f.sf.data();
    f.p.pool_size = pool_size;
    f.p.state_indices = f.cu_dev_stand_in.data();
    f.p.state_indices_host = f.idx.data();
  };
  {
    Fixture f;
    pooled(f, {1, -1}, 2);
    EXPECT_EQ(kla_validate(&f.p), KLA_SUCCESS) << kla_last_error_message();
  }
  // Pool rows live in sf, so "nothing written" covers the pool too.
  for (auto idx : {std::vector<int32_t>{2, 0}, std::vector<int32_t>{0, -2}}) {
    Fixture f;
    pooled(f, idx, 2);
    expect_rejected(f, KLA_ERROR_BAD_INDEX, "state_indices[");
  }
  {
    Fixture f;
    pooled(f, {1, 1}, 2);
    expect_rejected(f, KLA_ERROR_BAD_INDEX, "repeats");
  }
  {
    Fixture f;
    pooled(f, {0, 1}, 0);
    expect_rejected(f, KLA_ERROR_INVALID_SIZE, "pool_size");
  }
  {  // pool rows are indexed by int32 state_indices
    Fixture f;
    pooled(f, {0, 1}, int64_t(1) << 31);
    expect_rejected(f, KLA_ERROR_INVALID_SIZE, "pool_size = 2147483648 exceeds 2^31-1");
  }
  {
    Fixture f;
    pooled(f, {0, 1}, 2);
    f.p.initial_state = f.s0.data();
    expect_rejected(f, KLA_ERROR_INVALID_VALUE, "state_pool excludes");
  }
  {
    Fixture f;
    pooled(f, {0, 1}, 2);
    f.p.state_indices_host = nullptr;
    expect_rejected(f, KLA_ERROR_NULL_POINTER, "state_indices_host");
  }
}

TEST(Validate, PartiallyOverlappingStates) {
  Fixture f;
  f.p.initial_state = f.sf.data() + 16;
  expect_rejected(f, KLA_ERROR_INVALID_VALUE, "overlaps");
}

TEST(Validate, StatusStringsAndVersion) {
  std::set<std::string> seen;
  for (int s = 0; s <= KLA_ERROR_ABI_MISMATCH; ++s)
    EXPECT_TRUE(seen.insert(kla_status_string(static_cast<kla_status>(s))).second);
  EXPECT_STREQ(kla_status_string(KLA_ERROR_UNSUPPORTED_PATH), "KLA_ERROR_UNSUPPORTED_PATH");
  EXPECT_STREQ(kla_status_string(KLA_ERROR_ABI_MISMATCH), "KLA_ERROR_ABI_MISMATCH");
  EXPECT_STREQ(kla_status_string(static_cast<kla_status>(KLA_ERROR_ABI_MISMATCH + 1)),
               "KLA_ERROR_UNKNOWN_STATUS");
  EXPECT_STREQ(kla_status_string(static_cast<kla_status>(99)), "KLA_ERROR_UNKNOWN_STATUS");
  EXPECT_STREQ(kla_status_string(static_cast<kla_status>(-1)), "KLA_ERROR_UNKNOWN_STATUS");
  EXPECT_GT(std::strlen(kla_version_string()), 0u);
  EXPECT_EQ(kla_workspace_size(nullptr), 0u);
}

// ---- ABI 4: the stamp, the path request --------------------------------------------------------

TEST(Validate, AbiStamp) {
  kla_params p;
  std::memset(&p, 0xA5, sizeof p);
  kla_params_init(&p);
  EXPECT_EQ(p.abi_version, uint32_t(KLA_ABI_VERSION));
  EXPECT_EQ(p.struct_size, uint32_t(sizeof(kla_params)));
  EXPECT_EQ(p.path, KLA_PATH_AUTO);
  EXPECT_EQ(p.value_slice, 0);
  EXPECT_EQ(kla_abi_version(), uint32_t(KLA_ABI_VERSION));
  kla::cuda::Params cp;  // the C++ wrapper stamps through kla_params_init too
  EXPECT_EQ(cp.abi_version, uint32_t(KLA_ABI_VERSION));
  EXPECT_EQ(cp.struct_size, uint32_t(sizeof(kla_params)));
  kla_params_init(nullptr);  // harmless
}

TEST(Validate, AbiMismatchIsCheckedFirst) {
  // Another ABI version or struct size, everything else valid.
  for (uint32_t v : {0u, 3u, uint32_t(KLA_ABI_VERSION + 1)}) {
    Fixture f;
    f.p.abi_version = v;
    expect_rejected(f, KLA_ERROR_ABI_MISMATCH, "abi_version = " + std::to_string(v) + ",");
  }
  for (uint32_t size : {0u, uint32_t(sizeof(kla_params) - 8), uint32_t(sizeof(kla_params) + 8)}) {
    Fixture f;
    f.p.struct_size = size;
    expect_rejected(f, KLA_ERROR_ABI_MISMATCH, "struct_size = " + std::to_string(size) + ";");
  }
  // Every other field garbage (what another layout's fields look like at these offsets: null or
  // odd pointers, negative sizes, unknown enums): the stamp is still what is reported.
  for (int fill : {0x00, 0xFF, 0xA5}) {
    Fixture f;
    std::memset(&f.p, fill, sizeof f.p);
    f.p.abi_version = 3;
    f.p.struct_size = uint32_t(sizeof(kla_params));
    expect_rejected(f, KLA_ERROR_ABI_MISMATCH, "abi_version = 3");
    std::memset(&f.p, fill, sizeof f.p);  // the stamp garbage too
    expect_rejected(f, KLA_ERROR_ABI_MISMATCH,
                    "this library is ABI " + std::to_string(KLA_ABI_VERSION));
  }
  {  // The right stamp over the same garbage is refused by the other checks instead.
    Fixture f;
    std::memset(&f.p, 0xFF, sizeof f.p);
    f.p.abi_version = KLA_ABI_VERSION;
    f.p.struct_size = uint32_t(sizeof(kla_params));
    const kla_status s = kla_validate(&f.p);
    EXPECT_NE(s, KLA_SUCCESS);
    EXPECT_NE(s, KLA_ERROR_ABI_MISMATCH) << kla_last_error_message();
  }
  {  // kla_workspace_size sizes nothing for a struct of another layout.
    Fixture f;
    EXPECT_GT(kla_workspace_size(&f.p), 0u);
    f.p.abi_version = 3;
    EXPECT_EQ(kla_workspace_size(&f.p), 0u);
  }
}

TEST(Validate, InitForAnotherLayoutWritesOnlyTheStamp) {
  // kla_params_init passes the caller's KLA_ABI_VERSION and sizeof(kla_params); a caller (or a
  // binding) with another layout gets its stamp and not one byte more, so that every entry point
  // refuses the struct.
  auto bytes_from = [](const kla_params& p, std::size_t from, unsigned char value) {
    const auto* b = reinterpret_cast<const unsigned char*>(&p);
    for (std::size_t i = from; i < sizeof p; ++i)
      if (b[i] != value) return false;
    return true;
  };
  for (uint32_t size : {uint32_t(sizeof(kla_params)), 64u, 8u}) {
    kla_params p;
    std::memset(&p, 0x5A, sizeof p);
    kla_params_init_abi(&p, 3, size);
    EXPECT_EQ(p.abi_version, 3u);
    EXPECT_EQ(p.struct_size, size);
    EXPECT_TRUE(bytes_from(p, 2 * sizeof(uint32_t), 0x5A)) << "struct_size " << size;
    EXPECT_EQ(kla_validate(&p), KLA_ERROR_ABI_MISMATCH);
  }
  {  // This ABI with a smaller struct: a mismatch too.
    kla_params p;
    std::memset(&p, 0x5A, sizeof p);
    kla_params_init_abi(&p, KLA_ABI_VERSION, 64);
    EXPECT_EQ(p.struct_size, 64u);
    EXPECT_TRUE(bytes_from(p, 2 * sizeof(uint32_t), 0x5A));
    EXPECT_EQ(kla_validate(&p), KLA_ERROR_ABI_MISMATCH);
  }
  {  // A struct too small for the stamp: nothing written at all.
    kla_params p;
    std::memset(&p, 0x5A, sizeof p);
    kla_params_init_abi(&p, 3, 4);
    EXPECT_TRUE(bytes_from(p, 0, 0x5A));
  }
  {  // This layout: the full defaults.
    kla_params p;
    std::memset(&p, 0x5A, sizeof p);
    kla_params_init_abi(&p, KLA_ABI_VERSION, uint32_t(sizeof(kla_params)));
    EXPECT_EQ(p.eta_value, 1.0f);
    EXPECT_EQ(p.path, KLA_PATH_AUTO);
    EXPECT_EQ(p.workspace, nullptr);
  }
}

TEST(Validate, PathRequest) {
  const kla_path paths[] = {KLA_PATH_AUTO, KLA_PATH_WY,      KLA_PATH_WY_TRANSPOSED,
                            KLA_PATH_TF32, KLA_PATH_GENERIC, KLA_PATH_TOKENWISE};
  // Every path validates: whether it can run the call is the plan's answer
  // (KLA_ERROR_UNSUPPORTED_PATH), not validation's.
  for (kla_path path : paths) {
    Fixture f;
    f.p.path = path;
    EXPECT_EQ(kla_validate(&f.p), KLA_SUCCESS)
        << kla_path_name(path) << ": " << kla_last_error_message();
  }
  for (int bad : {6, 7, -1, 1 << 20}) {
    Fixture f;
    f.p.path = static_cast<kla_path>(bad);
    expect_rejected(f, KLA_ERROR_INVALID_VALUE, "path = " + std::to_string(bad) + " is unknown");
  }
}

TEST(Validate, ValueSlice) {
  // 0 (the plan's choice) or a width some path has, 8, 16, 32 or 64, with any explicit path
  // (whether that path takes that width is again the plan's answer).
  for (kla_path path :
       {KLA_PATH_WY, KLA_PATH_WY_TRANSPOSED, KLA_PATH_TF32, KLA_PATH_GENERIC, KLA_PATH_TOKENWISE})
    for (int vs : {0, 8, 16, 32, 64}) {
      Fixture f;
      f.p.path = path;
      f.p.value_slice = vs;
      EXPECT_EQ(kla_validate(&f.p), KLA_SUCCESS)
          << kla_path_name(path) << " " << vs << ": " << kla_last_error_message();
    }
  for (int vs : {-16, -1, 1, 4, 12, 24, 48, 96, 128, 256}) {
    Fixture f;
    f.p.path = KLA_PATH_GENERIC;
    f.p.value_slice = vs;
    expect_rejected(f, KLA_ERROR_INVALID_VALUE, "value_slice = " + std::to_string(vs) + " is not");
  }
  // A width needs a path: AUTO chooses its own.
  for (int vs : {8, 16, 32, 64}) {
    Fixture f;
    f.p.value_slice = vs;
    expect_rejected(f, KLA_ERROR_INVALID_VALUE,
                    "value_slice = " + std::to_string(vs) + " needs an explicit path");
  }
}

TEST(Validate, PathNames) {
  EXPECT_STREQ(kla_path_name(KLA_PATH_AUTO), "auto");
  EXPECT_STREQ(kla_path_name(KLA_PATH_WY), "wy");
  EXPECT_STREQ(kla_path_name(KLA_PATH_WY_TRANSPOSED), "wy_transposed");
  EXPECT_STREQ(kla_path_name(KLA_PATH_TF32), "tf32");
  EXPECT_STREQ(kla_path_name(KLA_PATH_GENERIC), "generic");
  EXPECT_STREQ(kla_path_name(KLA_PATH_TOKENWISE), "tokenwise");
  for (int bad : {6, -1, 1000})
    EXPECT_STREQ(kla_path_name(static_cast<kla_path>(bad)), "unknown") << bad;
}

TEST(Validate, Workspace) {
  Fixture f;
  // A record per (64-token chunk, value head), room for either fast path (docs/api.md): the
  // TF32 path's T, P and scalars, or the WY path's T and P T (the 10 lower 16 x 16 blocks of
  // each, bf16 hi + lo) and 512 scalars.
  constexpr std::size_t tf32 = (2 * 64 * 64 + 5 * 64) * sizeof(float);
  constexpr std::size_t wy = 4 * 10 * 16 * 16 * 2 + 512 * 4;
  constexpr std::size_t per_chunk = tf32 > wy ? tf32 : wy;
  const std::size_t need = kla_workspace_size(&f.p);
  EXPECT_EQ(need, std::size_t(B) * HV * per_chunk);  // T = 5: one chunk per sequence
  std::vector<float> ws(need / sizeof(float) + 16, 0.0f);
  f.p.workspace = ws.data();
  f.p.workspace_size = need;
  EXPECT_EQ(kla_validate(&f.p), KLA_SUCCESS) << kla_last_error_message();
  f.p.workspace_size = need - 16;
  expect_rejected(f, KLA_ERROR_INVALID_SIZE, "workspace_size");
  f.p.workspace = ws.data() + 1;
  f.p.workspace_size = need + 64;
  expect_rejected(f, KLA_ERROR_MISALIGNED, "workspace");
  f.p.workspace = nullptr;  // no workspace: valid (the workspace-free kernel runs)
  EXPECT_EQ(kla_validate(&f.p), KLA_SUCCESS) << kla_last_error_message();
  // Packed sequences: T/64 + N chunk slots.
  Fixture g;
  const int32_t cu[3] = {0, 130, 200};
  g.p.batch = 1, g.p.seq_len = 200, g.p.num_seqs = 2;
  g.p.cu_seqlens = cu, g.p.cu_seqlens_host = cu;
  EXPECT_EQ(kla_workspace_size(&g.p), std::size_t(200 / 64 + 2) * HV * per_chunk);
  // fp32 with arithmetic FAST, with K in {64, 96, 128} (the WY path's list), adds per chunk and
  // key head the K and Q tiles split into bf16 hi + lo: ceil(K / 64) panels of 64 rows x 128 B,
  // each as a hi and a lo panel. bf16 and fp16 need none (their raw tiles are exact operands of
  // the bf16 / f16 wgmma), nor does accurate fp32 (the TF32 path), nor other K.
  auto image = [](std::size_t k) { return (k + 63) / 64 * 2 * 64 * 128; };
  for (kla_dtype dt : {KLA_DTYPE_FP32, KLA_DTYPE_FP16, KLA_DTYPE_BF16})
    for (kla_arithmetic m : {KLA_ARITHMETIC_ACCURATE, KLA_ARITHMETIC_FAST})
      for (int kd : {32, 64, 96, 128, 256}) {
        Fixture w;
        w.p.dtype = dt, w.p.arithmetic = m, w.p.head_dim_k = kd;
        const bool split = dt == KLA_DTYPE_FP32 && m == KLA_ARITHMETIC_FAST;
        const bool images = split && (kd == 64 || kd == 96 || kd == 128);
        EXPECT_EQ(kla_workspace_size(&w.p),
                  std::size_t(B) * (HV * per_chunk + (images ? 2 * H * image(kd) : 0)))
            << "dtype " << int(dt) << " arithmetic " << int(m) << " K " << kd;
      }
  // Head dims not set: the size for the largest supported ones (256 x 256) plus the largest
  // images (K = 128) whatever the dtype, never less than what any head dims need, so a buffer
  // sized early serves every call.
  Fixture u;
  u.p.head_dim_k = 0, u.p.head_dim_v = 0;
  EXPECT_EQ(kla_workspace_size(&u.p), std::size_t(B) * (HV * per_chunk + 2 * H * image(128)));
  EXPECT_GE(kla_workspace_size(&u.p), need);
  // num_heads not set: num_v_heads stands in for it (at least as many key heads as needed).
  Fixture h;
  h.p.head_dim_k = 128, h.p.num_heads = 0, h.p.arithmetic = KLA_ARITHMETIC_FAST;
  EXPECT_EQ(kla_workspace_size(&h.p), std::size_t(B) * (HV * per_chunk + 2 * HV * image(128)));
}

// Saved states (kla.h "Saved states"): (K V + 64 V) bf16 per (chunk slot, value head), only for
// bf16 FAST calls at K = V = 128 that can run one pass of a saving scan (the transposed one, or WY
// at 32 columns); any other call gets 0 and a message naming the reason.
Fixture saving_fixture() {
  Fixture f(128, 128);
  f.p.dtype = KLA_DTYPE_BF16, f.p.arithmetic = KLA_ARITHMETIC_FAST;
  return f;
}

TEST(Validate, SavedStatesSize) {
  constexpr std::size_t per_record = (128 * 128 + 64 * 128) * 2;  // 48 KB
  Fixture f = saving_fixture();
  EXPECT_EQ(kla_saved_states_size(&f.p), std::size_t(B) * HV * per_record)
      << kla_last_error_message();  // T = 5: one chunk slot a sequence
  f.p.seq_len = 129;                // three chunks a sequence
  EXPECT_EQ(kla_saved_states_size(&f.p), std::size_t(B) * 3 * HV * per_record);
  f.p.path = KLA_PATH_WY, f.p.value_slice = 32, f.p.segments = 1;  // a saving scan, explicitly
  EXPECT_EQ(kla_saved_states_size(&f.p), std::size_t(B) * 3 * HV * per_record);
  f.p.path = KLA_PATH_WY_TRANSPOSED, f.p.value_slice = 64;  // the other one
  EXPECT_EQ(kla_saved_states_size(&f.p), std::size_t(B) * 3 * HV * per_record)
      << kla_last_error_message();
  f.p.value_slice = 0;
  EXPECT_EQ(kla_saved_states_size(&f.p), std::size_t(B) * 3 * HV * per_record);
  // Packed sequences: T/64 + N chunk slots, as the workspace's.
  Fixture g = saving_fixture();
  const int32_t cu[3] = {0, 130, 200};
  g.p.batch = 1, g.p.seq_len = 200, g.p.num_seqs = 2;
  g.p.cu_seqlens = cu, g.p.cu_seqlens_host = cu;
  EXPECT_EQ(kla_saved_states_size(&g.p), std::size_t(200 / 64 + 2) * HV * per_record);
  struct Refusal {
    const char* what;
    void (*change)(kla_params&);
    const char* needle;
  };
  const Refusal refusals[] = {
      {"fp16", [](kla_params& p) { p.dtype = KLA_DTYPE_FP16; }, "bf16"},
      {"accurate", [](kla_params& p) { p.arithmetic = KLA_ARITHMETIC_ACCURATE; }, "FAST"},
      {"K = 64", [](kla_params& p) { p.head_dim_k = 64; }, "K = 64"},
      {"V = 64", [](kla_params& p) { p.head_dim_v = 64; }, "V = 64"},
      {"pool", [](kla_params& p) { p.state_pool = reinterpret_cast<float*>(16); }, "pool"},
      {"path tf32", [](kla_params& p) { p.path = KLA_PATH_TF32; }, "tf32"},
      {"path generic", [](kla_params& p) { p.path = KLA_PATH_GENERIC; }, "path generic"},
      {"value_slice 16",
       [](kla_params& p) {
         p.path = KLA_PATH_WY;
         p.value_slice = 16;
       },
       "value_slice = 16 was requested on path wy"},
      {"value_slice 32 transposed",
       [](kla_params& p) {
         p.path = KLA_PATH_WY_TRANSPOSED;
         p.value_slice = 32;
       },
       "value_slice = 32 was requested on path wy_transposed"},
      {"segments 4", [](kla_params& p) { p.segments = 4; }, "segments = 4"},
  };
  for (const Refusal& r : refusals) {
    Fixture h = saving_fixture();
    r.change(h.p);
    EXPECT_EQ(kla_saved_states_size(&h.p), 0u) << r.what;
    EXPECT_NE(std::string(kla_last_error_message()).find(r.needle), std::string::npos)
        << r.what << ": message '" << kla_last_error_message() << "' does not name '" << r.needle
        << "'";
  }
  EXPECT_EQ(kla_saved_states_size(nullptr), 0u);
  Fixture bad = saving_fixture();
  bad.p.struct_size -= 8;
  EXPECT_EQ(kla_saved_states_size(&bad.p), 0u);
  EXPECT_NE(std::string(kla_last_error_message()).find("another kla.h"), std::string::npos);
}

#ifdef KLA_TEST_WITH_CUDA
// The saving entry points check the saved buffer before they look for a device, so these
// refusals are the same with and without a GPU; nothing is written.
TEST(Validate, SavedStatesEntriesRefuseBadBuffers) {
  Fixture f = saving_fixture();
  const std::size_t need = kla_saved_states_size(&f.p);
  ASSERT_GT(need, 0u) << kla_last_error_message();
  std::vector<float> saved(need / sizeof(float) + 16, 12345.0f);
  auto expect = [&](kla_status got, kla_status want, const std::string& needle) {
    EXPECT_EQ(got, want) << kla_last_error_message();
    EXPECT_NE(std::string(kla_last_error_message()).find(needle), std::string::npos)
        << "message '" << kla_last_error_message() << "' does not name '" << needle << "'";
  };
  expect(kla_chunk_forward_saving(&f.p, nullptr, need, nullptr), KLA_ERROR_NULL_POINTER,
         "saved is NULL");
  expect(kla_chunk_forward_saving(&f.p, saved.data() + 1, need, nullptr), KLA_ERROR_MISALIGNED,
         "saved is not 16-byte aligned");
  expect(kla_chunk_forward_saving(&f.p, saved.data(), need - 16, nullptr), KLA_ERROR_INVALID_SIZE,
         "kla_saved_states_size");
  Fixture h = saving_fixture();
  h.p.arithmetic = KLA_ARITHMETIC_ACCURATE;
  expect(kla_chunk_forward_saving(&h.p, saved.data(), need, nullptr), KLA_ERROR_UNSUPPORTED_PATH,
         "cannot use saved states: only arithmetic FAST");
  kla_backward_params bp;
  kla_backward_params_init(&bp);
  bp.forward = f.p;
  // Separate outputs (overlapping ones would be refused first), never written.
  std::vector<float> dq(f.q.size(), 777.0f), dk(f.q.size(), 777.0f), dv(f.v.size(), 777.0f),
      dg(f.g.size(), 777.0f), deta(f.g.size(), 777.0f);
  bp.d_o = f.v.data();
  for (int i = 0; i < 3; ++i) bp.d_o_strides[i] = f.p.o_strides[i];
  bp.dq = dq.data(), bp.dk = dk.data(), bp.dv = dv.data();
  for (int i = 0; i < 3; ++i) {
    bp.dq_strides[i] = bp.dk_strides[i] = f.p.q_strides[i];
    bp.dv_strides[i] = f.p.v_strides[i];
  }
  bp.dg = dg.data(), bp.deta = deta.data();
  bp.dg_strides[0] = bp.deta_strides[0] = T * HV;
  bp.dg_strides[1] = bp.deta_strides[1] = HV;
  std::vector<float> ws(kla_backward_workspace_size(&bp) / sizeof(float) + 16);
  bp.workspace = ws.data(), bp.workspace_size = ws.size() * sizeof(float);
  expect(kla_chunk_backward_saved(&bp, nullptr, need, nullptr), KLA_ERROR_NULL_POINTER,
         "kla_chunk_backward_saved: saved is NULL");
  expect(kla_chunk_backward_saved(&bp, saved.data(), need - 16, nullptr), KLA_ERROR_INVALID_SIZE,
         "kla_saved_states_size");
  // The schedule request is checked before any device query too.
  expect(kla_chunk_backward_saved_as(&bp, saved.data(), need, 7, 0, nullptr),
         KLA_ERROR_INVALID_VALUE, "kla_chunk_backward_saved_as: state_grad = 7 is not");
  expect(kla_chunk_backward_saved_as(&bp, saved.data(), need, KLA_STATE_GRAD_SCAN, 32, nullptr),
         KLA_ERROR_INVALID_VALUE, "chain_segment = 32 needs state_grad CHAIN");
  expect(kla_chunk_backward_saved_as(&bp, nullptr, need, KLA_STATE_GRAD_AUTO, 0, nullptr),
         KLA_ERROR_NULL_POINTER, "kla_chunk_backward_saved_as: saved is NULL");
  EXPECT_TRUE(f.untouched());
  auto all = [](const std::vector<float>& x, float value) {
    for (float e : x)
      if (e != value) return false;
    return true;
  };
  EXPECT_TRUE(all(saved, 12345.0f));
  for (const auto* x : {&dq, &dk, &dv, &dg, &deta}) EXPECT_TRUE(all(*x, 777.0f));
}
#endif

/// A saved backward's params (bf16 FAST, K = V = 128, no decay or eta given) of H key heads and HV
/// value heads over the packed sequences `cu`, its tensors at made-up, disjoint, aligned device
/// addresses: the planners read the sizes and cu_seqlens_host, never the tensors.
struct PlanProblem {
  std::vector<int32_t> cu;
  kla_backward_params bp;
  PlanProblem(std::vector<int32_t> cu_in, int heads, int heads_v) : cu(std::move(cu_in)) {
    constexpr int D = 128;
    const int64_t tokens = cu.back();
    std::uintptr_t next = std::uintptr_t(1) << 44;
    auto at = [&next]() {  // 64 GiB apart: more than any tensor here
      const std::uintptr_t a = next;
      next += std::uintptr_t(1) << 36;
      return reinterpret_cast<void*>(a);
    };
    kla_backward_params_init(&bp);
    kla_params& f = bp.forward;
    f.dtype = KLA_DTYPE_BF16, f.arithmetic = KLA_ARITHMETIC_FAST;
    f.batch = 1, f.seq_len = tokens, f.num_heads = heads, f.num_v_heads = heads_v;
    f.head_dim_k = f.head_dim_v = D;
    f.q = at(), f.k = at(), f.v = at();
    const int64_t qs[3] = {tokens * heads * D, heads * D, D},
                  vs[3] = {tokens * heads_v * D, heads_v * D, D};
    for (int i = 0; i < 3; ++i) {
      f.q_strides[i] = f.k_strides[i] = bp.dq_strides[i] = bp.dk_strides[i] = qs[i];
      f.v_strides[i] = f.o_strides[i] = bp.d_o_strides[i] = bp.dv_strides[i] = vs[i];
    }
    f.cu_seqlens = static_cast<const int32_t*>(at());
    f.cu_seqlens_host = cu.data();
    f.num_seqs = int64_t(cu.size()) - 1;
    bp.d_o = at(), bp.dq = at(), bp.dk = at(), bp.dv = at();
    bp.workspace = at();
    bp.workspace_size = kla_backward_workspace_size(&bp);
  }
};

/// kla_plan_chunk_backward_saved_for (no GPU needed): what AUTO picks for issue 25's rows on an
/// H100 / H200, each request honoured or refused with the reason, and a refusal writes no plan.
TEST(Validate, SavedBackwardPlan) {
  constexpr kla_device_info kA100{8, 0, 108, 232448, 1};  // an sm_80 device, shared memory ample
  constexpr kla_device_info kH100Pcie{9, 0, 114, 232448, 1};
  constexpr kla_device_info kNoMultiprocessors{9, 0, 0, 232448, 1};
  constexpr kla_device_info kSmallSmem{9, 0, 132, 48 * 1024, 1};
  kla_backward_plan plan;
  auto message = [] { return std::string(kla_last_error_message()); };
  // The plan of `pp` on `device` for a request: the schedule, segment and prep placement it names,
  // and its reason containing `needle`.
  auto expect_plan = [&](PlanProblem& pp, const kla_device_info& device, int32_t request,
                         int32_t segment, kla_state_grad state_grad, int32_t chain_segment,
                         int32_t prep_beside, const std::string& needle) {
    ASSERT_EQ(kla_plan_chunk_backward_saved_for(&pp.bp, &device, request, segment, &plan),
              KLA_SUCCESS)
        << message();
    EXPECT_EQ(plan.state_grad, state_grad) << plan.reason;
    EXPECT_EQ(plan.chain_segment, chain_segment) << plan.reason;
    EXPECT_EQ(plan.prep_beside, prep_beside) << plan.reason;
    EXPECT_NE(std::string(plan.reason).find(needle), std::string::npos) << plan.reason;
  };
  PlanProblem long_one({0, 32768}, 16, 32), short_one({0, 8192}, 16, 32);
  ASSERT_EQ(kla_plan_chunk_backward_saved_for(&long_one.bp, &kH200, KLA_STATE_GRAD_AUTO, 0, &plan),
            KLA_SUCCESS)
      << message();
  if (plan.state_grad == KLA_STATE_GRAD_SCAN) {  // a build without an sm_90a image: no chain
    EXPECT_NE(std::string(plan.reason).find("built without sm_90a kernels"), std::string::npos)
        << plan.reason;
    GTEST_SKIP() << "this library has no sm_90a image, so the chain never runs: " << plan.reason;
  }
  // The segments bwd_chain_segment's static_assert names (measured best on an H200).
  expect_plan(long_one, kH200, KLA_STATE_GRAD_AUTO, 0, KLA_STATE_GRAD_CHAIN, 128, 0,
              "chain: segments of 128 chunks (the model");
  expect_plan(short_one, kH200, KLA_STATE_GRAD_AUTO, 0, KLA_STATE_GRAD_CHAIN, 32, 0,
              "chain: segments of 32 chunks (the model");
  expect_plan(short_one, kH200, KLA_STATE_GRAD_CHAIN, 0, KLA_STATE_GRAD_CHAIN, 32, 0, "(the model");
  expect_plan(short_one, kH200, KLA_STATE_GRAD_CHAIN, 8, KLA_STATE_GRAD_CHAIN, 8, 0, "(requested)");
  // The scan requested: 1 x 32 x 4 = 128 scan blocks are one wave on 132 multiprocessors (the
  // prep beside the scan), not on 114 (the prep before it); 64 value heads are two waves.
  expect_plan(short_one, kH200, KLA_STATE_GRAD_SCAN, 0, KLA_STATE_GRAD_SCAN, 0, 1,
              "scan, the prep beside it (128 scan blocks on 132 multiprocessors) (requested)");
  expect_plan(short_one, kH100Pcie, KLA_STATE_GRAD_SCAN, 0, KLA_STATE_GRAD_SCAN, 0, 0,
              "scan, the prep before it (128 scan blocks on 114");
  PlanProblem wide({0, 8192}, 16, 64);
  expect_plan(wide, kH200, KLA_STATE_GRAD_SCAN, 0, KLA_STATE_GRAD_SCAN, 0, 0,
              "scan, the prep before it (256 scan blocks");
  // Not an sm_90 device: AUTO takes the scan and says why; CHAIN is refused (below).
  expect_plan(long_one, kA100, KLA_STATE_GRAD_AUTO, 0, KLA_STATE_GRAD_SCAN, 0, 0,
              "the chain declined: the chain is sm_90a code");

  struct Refusal {
    const char* what;
    PlanProblem* problem;
    const kla_device_info* device;
    int state_grad;
    int32_t segment;
    bool null_plan;
    kla_status status;
    const char* needle;
  };
  PlanProblem fp32({0, 8192}, 16, 32);
  fp32.bp.forward.dtype = KLA_DTYPE_FP32;
  const Refusal refusals[] = {
      {"CHAIN on sm_80", &long_one, &kA100, KLA_STATE_GRAD_CHAIN, 0, false,
       KLA_ERROR_UNSUPPORTED_PATH, "state_grad CHAIN cannot run: the chain is sm_90a code"},
      {"no such state_grad", &long_one, &kH200, 7, 0, false, KLA_ERROR_INVALID_VALUE,
       "state_grad = 7 is not a kla_state_grad"},
      {"a segment not a power of two", &long_one, &kH200, KLA_STATE_GRAD_CHAIN, 12, false,
       KLA_ERROR_INVALID_VALUE, "chain_segment = 12 is not 0 or a power of two from 8 to 128"},
      {"a segment too long", &long_one, &kH200, KLA_STATE_GRAD_CHAIN, 256, false,
       KLA_ERROR_INVALID_VALUE, "chain_segment = 256"},
      {"a segment too short", &long_one, &kH200, KLA_STATE_GRAD_CHAIN, 4, false,
       KLA_ERROR_INVALID_VALUE, "chain_segment = 4"},
      {"a segment with SCAN", &long_one, &kH200, KLA_STATE_GRAD_SCAN, 16, false,
       KLA_ERROR_INVALID_VALUE, "chain_segment = 16 needs state_grad CHAIN"},
      {"a segment with AUTO", &long_one, &kH200, KLA_STATE_GRAD_AUTO, 16, false,
       KLA_ERROR_INVALID_VALUE, "needs state_grad CHAIN"},
      {"no plan", &long_one, &kH200, KLA_STATE_GRAD_AUTO, 0, true, KLA_ERROR_NULL_POINTER,
       "plan is NULL"},
      {"no device", &long_one, nullptr, KLA_STATE_GRAD_AUTO, 0, false, KLA_ERROR_NULL_POINTER,
       "device is NULL"},
      {"too little shared memory", &long_one, &kSmallSmem, KLA_STATE_GRAD_SCAN, 0, false,
       KLA_ERROR_UNSUPPORTED_PATH, "bytes of shared memory per block at K = 128"},
      {"a device without multiprocessors", &long_one, &kNoMultiprocessors, KLA_STATE_GRAD_AUTO, 0,
       false, KLA_ERROR_INVALID_VALUE, "device->multiprocessors = 0 is not in [1, 2^20]"},
      {"a call that cannot save", &fp32, &kH200, KLA_STATE_GRAD_AUTO, 0, false,
       KLA_ERROR_UNSUPPORTED_PATH, "cannot use saved states: only bf16 calls save"},
  };
  for (const Refusal& r : refusals) {
    kla_backward_plan untouched;
    std::memset(&plan, 0x5A, sizeof plan);
    std::memset(&untouched, 0x5A, sizeof untouched);
    EXPECT_EQ(kla_plan_chunk_backward_saved_for(&r.problem->bp, r.device, r.state_grad, r.segment,
                                                r.null_plan ? nullptr : &plan),
              r.status)
        << r.what << ": " << message();
    EXPECT_NE(message().find(r.needle), std::string::npos)
        << r.what << ": message '" << message() << "' does not name '" << r.needle << "'";
    EXPECT_EQ(std::memcmp(&plan, &untouched, sizeof plan), 0) << r.what << ": wrote the plan";
  }
}

TEST(Validate, CppWrapper) {
  kla::cuda::Params p;  // defaults: no sizes
  EXPECT_EQ(kla::cuda::validate(p), KLA_ERROR_INVALID_SIZE);
  try {
    kla::cuda::check(kla::cuda::validate(p));
    FAIL() << "no throw";
  } catch (const kla::cuda::Error& e) {
    EXPECT_EQ(e.status(), KLA_ERROR_INVALID_SIZE);
    EXPECT_NE(std::string(e.what()).find("batch"), std::string::npos);
  }
}

#ifdef KLA_TEST_WITH_CUDA
TEST(Validate, NoDeviceIsReported) {
  if (have_gpu()) GTEST_SKIP() << "a CUDA device is present; the no-device path is not reachable";
  Fixture f;
  EXPECT_EQ(kla_chunk_forward(&f.p, nullptr), KLA_ERROR_NO_DEVICE);
  EXPECT_NE(std::string(kla_last_error_message()).find("no CUDA device"), std::string::npos);
  EXPECT_EQ(kla_tokenwise_forward(&f.p, nullptr), KLA_ERROR_NO_DEVICE);
  EXPECT_TRUE(f.untouched());
}
#endif

}  // namespace
