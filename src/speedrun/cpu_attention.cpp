// A decode step's attention on the CPU (speedrun.kernels): for each (row, key/value head), its query heads' scores
// over the cache, their softmax and the values' weighted sum, in fp32 over fp32 or bf16; masked keys take no weight.
// PyTorch's batched products, casts, mask and softmax for this (one query row per head over a ~100-key cache) cost
// about twice the time it takes to read the cache. A thread computes whole (row, head) pairs, so results do not
// depend on the thread count. The samples of one prompt hold copies of its keys and values (KVCache.expand): each row
// reads those columns from its source row, one row's copy a prompt, not each sample's (the same sums: the copies are
// equal). With AVX512 the softmax's max and exps run 16 keys at a time and a value row serves a key/value head's
// query heads at once; every sum still adds its terms in attend()'s order, so the bits are attend()'s.
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "cpu_kernels.h"

namespace {
using namespace speedrun_kernels;

// a (row, head)'s keys or values from its first attended column: the first `split` from its source row's copy
template <typename T>
struct Rows {
  const T* shared;
  const T* own;
  int64_t split, D;
  const T* operator[](int64_t s) const { return (s < split ? shared : own) + s * D; }
};

// scores[0, S) of one query head -> its softmax weights (masked keys 0); returns the weights' sum
inline float softmax_weights(float* scores, const bool* valid, int64_t S) {
  float mx = -INFINITY;
  for (int64_t s = 0; s < S; ++s) mx = valid[s] && scores[s] > mx ? scores[s] : mx;
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t s = 0; s < S; ++s) {
    const float e = valid[s] ? exp_clamped(scores[s] - mx) : 0.f;
    scores[s] = e;
    sum += e;
  }
  return sum;
}

// one (row, key/value head): q [G, D], k and v [S, D], valid [S] -> y [G, D]; any head width
template <typename T>
void attend(const T* q, Rows<T> k, Rows<T> v, const bool* valid, T* y, int64_t G, int64_t S, int64_t D, float scale,
            float* scores, float* qf, float* acc) {
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t d = 0; d < D; ++d) qf[d] = to_float(q[g * D + d]) * scale;
    for (int64_t s = 0; s < S; ++s) {
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < D; ++d) dot += qf[d] * to_float(k[s][d]);
      scores[s] = dot;
    }
    const float inv = 1.f / softmax_weights(scores, valid, S);
    std::fill(acc, acc + D, 0.f);
    for (int64_t s = 0; s < S; ++s)
      if (valid[s])
        for (int64_t d = 0; d < D; ++d) acc[d] += scores[s] * to_float(v[s][d]);
    for (int64_t d = 0; d < D; ++d) store(y + g * D + d, acc[d] * inv);
  }
}

#if defined(__AVX512F__)
// lane j of the result: the sum of v[j]'s 16 lanes. Four levels, each adding the two halves of a pair's partial sums
// laid side by side: 45 instructions for 16 sums, where one horizontal sum each would take about 8.
inline __m512 sum16(__m512* v) {
  const __m512i lo[4] = {_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23),
                         _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27),
                         _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29),
                         _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)};
  for (int level = 0, n = 16; level < 4; ++level, n /= 2) {
    const __m512i hi = _mm512_add_epi32(lo[level], _mm512_set1_epi32(8 >> level));
    for (int i = 0; i < n / 2; ++i)
      v[i] = _mm512_add_ps(_mm512_permutex2var_ps(v[2 * i], lo[level], v[2 * i + 1]),
                           _mm512_permutex2var_ps(v[2 * i], hi, v[2 * i + 1]));
  }
  return v[0];
}

#if defined(__AVX512BF16__)
// a bf16 query head's scores over keys k [S, D] with AVX512-BF16's pairwise dot products (no conversion to fp32: the
// products are exact, their sums fp32), 16 keys at a time; D = 32 x NP
template <int NP>
void scores_bf16(const uint16_t* q, Rows<uint16_t> k, int64_t S, float scale, float* scores) {
  __m512bh qv[NP];
  for (int c = 0; c < NP; ++c) qv[c] = (__m512bh)_mm512_loadu_si512(q + 32 * c);
  const __m512 sc = _mm512_set1_ps(scale);
  int64_t s = 0;
  for (; s + 16 <= S; s += 16) {
    __m512 dots[16];
    for (int j = 0; j < 16; ++j) {
      dots[j] = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[0], (__m512bh)_mm512_loadu_si512(k[s + j]));
      for (int c = 1; c < NP; ++c)
        dots[j] = _mm512_dpbf16_ps(dots[j], qv[c], (__m512bh)_mm512_loadu_si512(k[s + j] + 32 * c));
    }
    _mm512_storeu_ps(scores + s, _mm512_mul_ps(sum16(dots), sc));
  }
  for (; s < S; ++s) {
    __m512 dot = _mm512_setzero_ps();
    for (int c = 0; c < NP; ++c) dot = _mm512_dpbf16_ps(dot, qv[c], (__m512bh)_mm512_loadu_si512(k[s] + 32 * c));
    scores[s] = _mm512_reduce_add_ps(dot) * scale;
  }
}
#endif

// one query head's scores over keys k [S, D] (D = 16 x NC), scaled: 16 keys at a time
template <typename T, int NC>
void scores16(const T* q, Rows<T> k, int64_t S, float scale, float* scores) {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, uint16_t> && NC % 2 == 0) return scores_bf16<NC / 2>(q, k, S, scale, scores);
#endif
  __m512 qv[NC];
  for (int c = 0; c < NC; ++c) qv[c] = _mm512_mul_ps(load16(q + 16 * c), _mm512_set1_ps(scale));
  int64_t s = 0;
  for (; s + 16 <= S; s += 16) {  // masked keys too (their weight is 0 below)
    __m512 dots[16];
    for (int j = 0; j < 16; ++j) {
      dots[j] = _mm512_mul_ps(qv[0], load16(k[s + j]));
      for (int c = 1; c < NC; ++c) dots[j] = _mm512_fmadd_ps(qv[c], load16(k[s + j] + 16 * c), dots[j]);
    }
    _mm512_storeu_ps(scores + s, sum16(dots));
  }
  for (; s < S; ++s) {
    __m512 dot = _mm512_mul_ps(qv[0], load16(k[s]));
    for (int c = 1; c < NC; ++c) dot = _mm512_fmadd_ps(qv[c], load16(k[s] + 16 * c), dot);
    scores[s] = _mm512_reduce_add_ps(dot);
  }
}

// valid[0, 16) as a lane mask
inline __mmask16 valid16(const bool* valid) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(valid));
  return _mm_test_epi8_mask(b, b);
}

// softmax_weights' weights, 16 keys at a time, without its sum: the same max (whatever the order it is taken in) and
// each exp the same (exp16 is exp_clamped lane by lane)
inline void weights16(float* scores, const bool* valid, int64_t S) {
  __m512 lanes = _mm512_set1_ps(-INFINITY);
  int64_t s = 0;
  for (; s + 16 <= S; s += 16) {
    const __m512 x = _mm512_loadu_ps(scores + s);
    lanes = _mm512_mask_mov_ps(lanes, _mm512_mask_cmp_ps_mask(valid16(valid + s), x, lanes, _CMP_GT_OQ), x);
  }
  alignas(64) float lane[16];
  _mm512_store_ps(lane, lanes);
  float mx = -INFINITY;
  for (const float l : lane) mx = l > mx ? l : mx;
  for (int64_t t = s; t < S; ++t) mx = valid[t] && scores[t] > mx ? scores[t] : mx;
  const __m512 m = _mm512_set1_ps(mx);
  for (s = 0; s + 16 <= S; s += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + s), m));
    _mm512_storeu_ps(scores + s, _mm512_maskz_mov_ps(valid16(valid + s), e));
  }
  for (; s < S; ++s) scores[s] = valid[s] ? exp_clamped(scores[s] - mx) : 0.f;
}

// attend() for GN query heads with 16-lane vectors and the head width fixed (NC chunks of 16): each head's scores and
// weights, then the values' weighted sums a 16-wide chunk at a time, every head's sum of the chunk in a register, so a
// value chunk is read once for all GN heads. The (row, head)'s keys and values (~14 KB at SmolLM2's shapes) stay in L1
// across its query heads. The bits of attend(): each sum adds the same terms in the same order.
template <typename T, int NC, int GN>
void heads16(const T* q, Rows<T> k, Rows<T> v, const bool* valid, T* y, int64_t S, float scale, float* scores) {
  constexpr int D = 16 * NC;
  float sum[GN] = {};
  for (int g = 0; g < GN; ++g) {
    scores16<T, NC>(q + g * D, k, S, scale, scores + g * S);
    weights16(scores + g * S, valid, S);
  }
  for (int64_t s = 0; s < S; ++s)  // in key order, as softmax_weights adds them
    for (int g = 0; g < GN; ++g) sum[g] += scores[g * S + s];
  alignas(64) float out[GN][D];
  for (int c = 0; c < NC; ++c) {
    __m512 acc[GN];
    for (int g = 0; g < GN; ++g) acc[g] = _mm512_setzero_ps();
    for (int64_t s = 0; s < S; ++s) {
      if (!valid[s]) continue;  // skipped, not weighted 0: an unwritten column may hold anything
      const __m512 x = load16(v[s] + 16 * c);
      for (int g = 0; g < GN; ++g) acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(scores[g * S + s]), x, acc[g]);
    }
    for (int g = 0; g < GN; ++g)
      _mm512_store_ps(out[g] + 16 * c, _mm512_mul_ps(acc[g], _mm512_set1_ps(1.f / sum[g])));
  }
  for (int g = 0; g < GN; ++g)
    for (int d = 0; d < D; ++d) store(y + g * D + d, out[g][d]);
}

// attend() with 16-lane vectors: the query heads in groups of up to 4 (SmolLM2's are 3 a key/value head); scores
// holds G x S floats
template <typename T, int NC>
void attend16(const T* q, Rows<T> k, Rows<T> v, const bool* valid, T* y, int64_t G, int64_t S, float scale,
              float* scores) {
  constexpr int D = 16 * NC, GB = 4;
  for (int64_t g = 0; g < G; g += GB) {
    const T* qg = q + g * D;
    T* yg = y + g * D;
    switch (std::min<int64_t>(GB, G - g)) {
      case 1: heads16<T, NC, 1>(qg, k, v, valid, yg, S, scale, scores); break;
      case 2: heads16<T, NC, 2>(qg, k, v, valid, yg, S, scale, scores); break;
      case 3: heads16<T, NC, 3>(qg, k, v, valid, yg, S, scale, scores); break;
      default: heads16<T, NC, GB>(qg, k, v, valid, yg, S, scale, scores);
    }
  }
}
#endif

template <typename T>
void run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& valid, at::Tensor& y,
         float scale, const int64_t* source, int64_t shared) {
  const int64_t H = q.size(1), G = q.size(2), D = q.size(3), S = k.size(2);
  const T *qp = raw<T>(q), *kp = raw<T>(k), *vp = raw<T>(v);
  const bool* mp = valid.data_ptr<bool>();
  T* yp = raw<T>(y);
  at::parallel_for(0, q.size(0) * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(G * S), qf(D), acc(D);
    for (int64_t bh = begin; bh < end; ++bh) {
      // only the keys from the row's first attended one to its last: not its left padding, nor the cache's columns
      // not yet written (a decode's cache is as wide as its last token's context)
      const int64_t b = bh / H, src = source == nullptr ? b : source[b];
      const bool* mb = mp + b * S;
      int64_t lo = 0, hi = S;
      while (lo < hi && !mb[lo]) ++lo;
      while (hi > lo && !mb[hi - 1]) --hi;
      const int64_t own = (bh * S + lo) * D, from = ((src * H + bh % H) * S + lo) * D;
      const int64_t split = std::max<int64_t>(0, std::min(shared, hi) - lo);  // columns [lo, shared): the source's
      const Rows<T> kb{kp + from, kp + own, split, D}, vb{vp + from, vp + own, split, D};
      const T* qb = qp + bh * G * D;
      T* yb = yp + bh * G * D;
      mb += lo;
#if defined(__AVX512F__)
      if (D == 64) { attend16<T, 4>(qb, kb, vb, mb, yb, G, hi - lo, scale, scores.data()); continue; }
      if (D == 128) { attend16<T, 8>(qb, kb, vb, mb, yb, G, hi - lo, scale, scores.data()); continue; }
      if (D == 32) { attend16<T, 2>(qb, kb, vb, mb, yb, G, hi - lo, scale, scores.data()); continue; }
      if (D == 16) { attend16<T, 1>(qb, kb, vb, mb, yb, G, hi - lo, scale, scores.data()); continue; }
#endif
      attend(qb, kb, vb, mb, yb, G, hi - lo, D, scale, scores.data(), qf.data(), acc.data());
    }
  });
}

}  // namespace

namespace speedrun_kernels {

// q [B, Hkv, G, D]: each key/value head's G query heads; k, v [B, Hkv, S, D]; valid [B, S] (True: attended); source
// [B] (int64, optional): the row whose columns [0, shared) hold the same keys and values as row b's (the first copy
// of its prompt's: KVCache.source), read in their place
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& valid,
                            double scale, const std::optional<at::Tensor>& source, int64_t shared) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() && valid.dim() == 2,
              "decode_attention: q [B, Hkv, G, D], k and v [B, Hkv, S, D], valid [B, S]");
  const int64_t B = q.size(0), S = k.size(2);
  TORCH_CHECK(k.size(0) == B && k.size(1) == q.size(1) && k.size(3) == q.size(3) && valid.size(0) == B &&
              valid.size(1) == S, "decode_attention: q, k, v and valid disagree on rows, heads, width or keys");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && valid.is_contiguous(),
              "decode_attention: inputs must be contiguous");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type() &&
              (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16) && valid.scalar_type() == at::kBool,
              "decode_attention: q, k, v all fp32 or all bf16, valid bool");
  TORCH_CHECK(q.device().is_cpu(), "decode_attention: a CPU kernel");
  const int64_t* src = nullptr;
  if (source.has_value()) {
    TORCH_CHECK(source->dim() == 1 && source->size(0) == B && source->scalar_type() == at::kLong &&
                source->is_contiguous() && source->device().is_cpu(), "decode_attention: source [B] int64 on the CPU");
    TORCH_CHECK(0 <= shared && shared <= S, "decode_attention: shared columns ", shared, " outside [0, ", S, "]");
    src = source->data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b)
      TORCH_CHECK(0 <= src[b] && src[b] < B, "decode_attention: source row ", src[b], " of row ", b, " outside [0, ",
                  B, ")");
  }
  at::Tensor y = at::empty_like(q);
  if (q.scalar_type() == at::kFloat) run<float>(q, k, v, valid, y, static_cast<float>(scale), src, shared);
  else run<uint16_t>(q, k, v, valid, y, static_cast<float>(scale), src, shared);
  return y;
}

}  // namespace speedrun_kernels

TORCH_LIBRARY_FRAGMENT(speedrun_kernels, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor valid, float scale, Tensor? source, int shared) -> "
        "Tensor", &speedrun_kernels::decode_attention);
}
