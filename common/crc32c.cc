#include "common/crc32c.h"

namespace psrt {
namespace crc32c {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78u;  // Castagnoli, reflected.

// table[0] is the classic byte-at-a-time table; table[k][b] is the CRC of
// byte b followed by k zero bytes, so 8 bytes are folded in with 8 lookups.
struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t crc = b;
      for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ (kPolynomial & (0u - (crc & 1)));
      t[0][b] = crc;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 1; k < 8; ++k) {
        t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
      }
    }
  }
};

const Tables& GetTables() {
  static const Tables* const tables = new Tables();  // Thread-safe init.
  return *tables;
}

inline uint32_t LoadLittleEndian32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
         uint32_t{p[3]} << 24;
}

}  // namespace

uint32_t Extend(uint32_t init_crc, const char* data, size_t n) {
  const auto& t = GetTables().t;
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  uint32_t crc = ~init_crc;
  // Byte at a time until p is 8-aligned, then 8 bytes at a time.
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
    --n;
  }
  while (n >= 8) {
    const uint32_t lo = LoadLittleEndian32(p) ^ crc;
    const uint32_t hi = LoadLittleEndian32(p + 4);
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^
          t[4][lo >> 24] ^ t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^
          t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
    --n;
  }
  return ~crc;
}

}  // namespace crc32c
}  // namespace psrt
