// Downstream use of kla::cuda: link the installed shared library and validate a params struct
// on the host (needs no GPU): the library's ABI is the header's, and a null q must be refused with
// a message naming it.
#include <cstdio>
#include <cstring>

#include <kla/kla.h>

int main() {
  kla_params p;
  kla_params_init(&p);
  p.dtype = KLA_DTYPE_BF16;
  p.batch = 1;
  p.seq_len = 16;
  p.num_heads = 1;
  p.num_v_heads = 1;
  p.head_dim_k = 64;
  p.head_dim_v = 64;
  const kla_status s = kla_validate(&p);
  const char* msg = kla_last_error_message();
  const bool ok = kla_abi_version() == KLA_ABI_VERSION && s == KLA_ERROR_NULL_POINTER &&
                  std::strstr(msg, "q is NULL") != nullptr;
  std::printf("kla %s downstream cuda: validate -> %s (%s): %s\n", kla_version_string(),
              kla_status_string(s), msg, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
