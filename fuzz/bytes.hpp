// A byte reader for the fuzz targets: consumes from the front, returns zeros once the input is
// exhausted (so every prefix of an input is itself a valid input, and seeds written by
// fuzz/make_seeds.py map field by field onto what the harness reads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kla::fuzz {

class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}

  std::uint8_t u8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t(u8()) << (8 * i);
    return v;
  }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t(u8()) << (8 * i);
    return v;
  }
  std::int64_t i64() {
    const std::uint64_t u = u64();
    std::int64_t v;
    std::memcpy(&v, &u, sizeof v);
    return v;
  }
  float f32() {
    const std::uint32_t u = u32();
    float v;
    std::memcpy(&v, &u, sizeof v);
    return v;
  }
  /// An integer in [lo, lo + span) (span >= 1).
  int range(int lo, int span) { return lo + int(u8() % unsigned(span)); }
  bool flag() { return (u8() & 1) != 0; }
  std::size_t left() const { return n_; }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
};

}  // namespace kla::fuzz
