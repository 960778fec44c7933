#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "common/thread_pool.h"
#include "kernels/cpu/dequant.h"

namespace moeshard {
namespace {

inline float Dot(const float* a, const float* b, int64_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
    s4 += a[i + 4] * b[i + 4];
    s5 += a[i + 5] * b[i + 5];
    s6 += a[i + 6] * b[i + 6];
    s7 += a[i + 7] * b[i + 7];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
}

}  // namespace

void MatMul(const float* x, int64_t T, const WeightRef& w, float* y, const float* bias) {
  const int64_t N = w.rows, K = w.cols;
  constexpr int64_t kRowsPerBlock = 4;
  int64_t grain = std::max<int64_t>(kRowsPerBlock, 16384 / std::max<int64_t>(1, K * std::max<int64_t>(T, 1)));
  ThreadPool::Default().ParallelFor((N + kRowsPerBlock - 1) / kRowsPerBlock, std::max<int64_t>(1, grain / kRowsPerBlock),
                                    [&](int64_t b0, int64_t b1) {
    std::vector<float> rows(kRowsPerBlock * K);
    for (int64_t b = b0; b < b1; ++b) {
      int64_t n0 = b * kRowsPerBlock, nn = std::min(kRowsPerBlock, N - n0);
      for (int64_t r = 0; r < nn; ++r) DequantRow(w, n0 + r, rows.data() + r * K);
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x + t * K;
        float* yt = y + t * N + n0;
        for (int64_t r = 0; r < nn; ++r) {
          yt[r] = Dot(xt, rows.data() + r * K, K) + (bias ? bias[n0 + r] : 0.f);
        }
      }
    }
  });
}

void RmsNorm(const float* x, int64_t T, int64_t D, const float* weight, float eps, float* out) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * D;
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(xt[i]) * xt[i];
    float inv = static_cast<float>(1.0 / std::sqrt(ss / D + eps));
    float* ot = out + t * D;
    for (int64_t i = 0; i < D; ++i) ot[i] = xt[i] * inv * (weight ? weight[i] : 1.f);
  }
}

void RopeNeox(float* x, int64_t T, int64_t heads, int64_t hd, const int32_t* pos, double theta) {
  const int64_t half = hd / 2;
  std::vector<float> cs(half), sn(half);
  std::vector<double> inv(half);
  for (int64_t i = 0; i < half; ++i) inv[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / hd);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      double a = static_cast<double>(pos[t]) * inv[i];
      cs[i] = static_cast<float>(std::cos(a));
      sn[i] = static_cast<float>(std::sin(a));
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * hd;
      for (int64_t i = 0; i < half; ++i) {
        float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
      }
    }
  }
}

void TopKRouting(const float* logits, int64_t T, int64_t E, int64_t k, bool softmax_topk_only,
                 bool renormalize, int32_t* ids, float* weights) {
  std::vector<int32_t> order(E);
  std::vector<float> probs(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return l[a] > l[b] || (l[a] == l[b] && a < b);
    });
    int32_t* it = ids + t * k;
    float* wt = weights + t * k;
    for (int64_t j = 0; j < k; ++j) it[j] = order[j];
    if (softmax_topk_only) {
      float m = l[it[0]];
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += std::exp(static_cast<double>(l[it[j]]) - m);
      for (int64_t j = 0; j < k; ++j) wt[j] = static_cast<float>(std::exp(static_cast<double>(l[it[j]]) - m) / sum);
    } else {
      float m = l[it[0]];
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e]) - m);
      double picked = 0;
      for (int64_t j = 0; j < k; ++j) {
        wt[j] = static_cast<float>(std::exp(static_cast<double>(l[it[j]]) - m) / sum);
        picked += wt[j];
      }
      if (renormalize) {
        for (int64_t j = 0; j < k; ++j) wt[j] = static_cast<float>(wt[j] / picked);
      }
    }
  }
}

void Attention(const float* q, int64_t T, int64_t nq, int64_t nkv, int64_t hd, int64_t pos0,
               const PagedKv& kv, int64_t window, float* out) {
  const int64_t group = nq / nkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t slot = nkv * hd;
  const int64_t bs = kv.block_size;
  // One item is one query position and `hp` heads of one KV head's group: each key and value row
  // is read once for those heads. Whole groups when there are enough items for the pool; one head
  // an item otherwise (a one-token decode keeps every thread busy). A head's arithmetic is the
  // same either way — scores, max, exponentials, sum and the weighted values in key order — so
  // the result does not depend on the split or on how the sequence is cut into steps.
  const int64_t hp = T * nkv >= 2 * ThreadPool::Default().size() ? group : 1;
  const int64_t per_pos = nq / hp;
  // Calls fn(kp, row offset of position kp's slot) for kp in [first, last], a block at a time.
  auto for_each_key = [&](int64_t first, int64_t last, auto&& fn) {
    for (int64_t kp = first; kp <= last;) {
      const int64_t off = kp % bs;
      const int64_t n = std::min(bs - off, last - kp + 1);
      const int64_t row0 = (kv.block_table[kp / bs] * bs + off) * slot;
      for (int64_t j = 0; j < n; ++j) fn(kp + j, row0 + j * slot);
      kp += n;
    }
  };
  ThreadPool::Default().ParallelFor(T * per_pos, 4, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores, m(hp);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / per_pos, h0 = (i % per_pos) * hp, g = h0 / group;
      const int64_t p = pos0 + t;
      const int64_t first = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
      const int64_t L = p - first + 1;
      scores.resize(hp * L);
      for (int64_t j = 0; j < hp; ++j) m[j] = -std::numeric_limits<float>::infinity();
      for_each_key(first, p, [&](int64_t kp, int64_t row) {
        const float* kh = kv.k + row + g * hd;
        for (int64_t j = 0; j < hp; ++j) {
          const float s = Dot(q + (t * nq + h0 + j) * hd, kh, hd) * scale;
          scores[j * L + kp - first] = s;
          m[j] = std::max(m[j], s);
        }
      });
      for (int64_t j = 0; j < hp; ++j) {
        float* sc = scores.data() + j * L;
        for (int64_t x = 0; x < L; ++x) sc[x] = std::exp(sc[x] - m[j]);
        // Four partial sums in double (the additions' latency, not their count, bounds this loop).
        double s4[4] = {0, 0, 0, 0};
        int64_t x = 0;
        for (; x + 4 <= L; x += 4) {
          for (int k = 0; k < 4; ++k) s4[k] += sc[x + k];
        }
        for (; x < L; ++x) s4[0] += sc[x];
        const double inv = 1.0 / ((s4[0] + s4[1]) + (s4[2] + s4[3]));
        for (x = 0; x < L; ++x) sc[x] = static_cast<float>(sc[x] * inv);
        std::fill(out + (t * nq + h0 + j) * hd, out + (t * nq + h0 + j + 1) * hd, 0.f);
      }
      for_each_key(first, p, [&](int64_t kp, int64_t row) {
        const float* vh = kv.v + row + g * hd;
        for (int64_t j = 0; j < hp; ++j) {
          const float wgt = scores[j * L + kp - first];
          float* oh = out + (t * nq + h0 + j) * hd;
          for (int64_t d = 0; d < hd; ++d) oh[d] += wgt * vh[d];
        }
      });
    }
  });
}

}  // namespace moeshard
