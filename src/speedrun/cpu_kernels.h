// The helpers the lab's CPU kernels share (cpu_attention.cpp, cpu_kernels.cpp; speedrun.kernels builds both): bf16
// read and written as its 16 bits, the bf16 rounding, an exp the compiler vectorizes, and their 16-lane forms.
#pragma once
#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace speedrun_kernels {

// The loops below read and write bf16 as its 16 bits (uint16_t): a loop over c10::BFloat16 the compiler does not
// vectorize. raw(): a tensor's data as such.
template <typename T>
inline T* raw(const at::Tensor& t) {
  if constexpr (std::is_same_v<T, float>) return t.data_ptr<float>();
  else return reinterpret_cast<uint16_t*>(t.data_ptr<c10::BFloat16>());
}

inline float to_float(float x) { return x; }
inline float to_float(uint16_t x) {  // bf16: its 16 bits are fp32's high half
  const uint32_t b = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// x rounded to T: for bf16 to nearest even (a NaN stays a NaN), as c10::BFloat16(x) rounds, in integer steps the
// compiler vectorizes
inline void store(float* p, float x) { *p = x; }
inline void store(uint16_t* p, float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  *p = (b & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0 : static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// exp(x), x clamped to [-87, 88]: Cephes' polynomial for expf, which the compiler vectorizes (std::exp it does not)
inline float exp_clamped(float x) {
  x = x < -87.f ? -87.f : x;  // selects the compiler vectorizes (built with -fno-trapping-math: speedrun.kernels)
  x = x > 88.f ? 88.f : x;
  // x = n ln 2 + r, |r| <= ln 2 / 2: n rounded by adding and taking away 1.5 x 2^23 (std::floor would keep the
  // compiler from vectorizing the loop)
  const float n = (x * 1.44269504f + 12582912.f) - 12582912.f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  float two_n;
  std::memcpy(&two_n, &bits, 4);
  return p * two_n;
}

#if defined(__AVX512F__)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {  // bf16 -> fp32: the 16 bits become the high half
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

#endif

#if defined(__AVX512F__)
// exp_clamped on 16 lanes, bit for bit: the same operations in the same order (a NaN stays a NaN)
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(88.f), _mm512_max_ps(_mm512_set1_ps(-87.f), x));  // a NaN x: the second operand
  const __m512 magic = _mm512_set1_ps(12582912.f);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504f), magic), magic);
  const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f),
                                   _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));  // 2^n
}

inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(uint16_t* p, __m512 v) {  // store()'s rounding on 16 lanes
  const __m512i b = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
#endif

// the decode attention (cpu_attention.cpp), which the fused Llama blocks (cpu_kernels.cpp) call as well
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& valid,
                            double scale, const std::optional<at::Tensor>& source, int64_t shared);

}  // namespace speedrun_kernels
