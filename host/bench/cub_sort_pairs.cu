// Time cub::DeviceRadixSort::SortPairs of (row key, position) pairs as FBGEMM's embedding
// backward sorts them (transpose_embedding_input: 64-bit keys, 32-bit values, only the key
// bits in use, end_bit = total_hash_size_bits), at several sizes and key widths.
// Build: nvcc -O3 -arch=sm_90 -o cub_sort_pairs cub_sort_pairs.cu
// Output: one JSON object per line: n, bits, value_bytes, temp_bytes, ms (median of 5 rounds
// of 20 back-to-back sorts between CUDA events, after 3 warm-up sorts).
#include <cub/cub.cuh>
#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <random>
#include <vector>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__global__ void mask_keys(const uint64_t* src, uint64_t* dst, int64_t n, uint64_t mask) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i] & mask;
}

template <typename V>
int run(int64_t n, int bits, const uint64_t* d_raw, uint64_t* d_kin, uint64_t* d_kout) {
  uint64_t mask = bits >= 64 ? ~0ull : ((1ull << bits) - 1);
  mask_keys<<<(unsigned)((n + 255) / 256), 256>>>(d_raw, d_kin, n, mask);
  V *d_vin, *d_vout;
  CK(cudaMalloc(&d_vin, n * sizeof(V)));
  CK(cudaMalloc(&d_vout, n * sizeof(V)));
  CK(cudaMemset(d_vin, 0, n * sizeof(V)));
  size_t temp = 0;
  CK(cub::DeviceRadixSort::SortPairs(nullptr, temp, d_kin, d_kout, d_vin, d_vout, (int)n, 0, bits));
  void* d_temp;
  CK(cudaMalloc(&d_temp, temp));
  for (int w = 0; w < 3; ++w)
    CK(cub::DeviceRadixSort::SortPairs(d_temp, temp, d_kin, d_kout, d_vin, d_vout, (int)n, 0, bits));
  CK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  const int reps = 20;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(a);
    for (int i = 0; i < reps; ++i)
      cub::DeviceRadixSort::SortPairs(d_temp, temp, d_kin, d_kout, d_vin, d_vout, (int)n, 0, bits);
    cudaEventRecord(b);
    CK(cudaEventSynchronize(b));
    float t;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t / reps);
  }
  std::sort(ms.begin(), ms.end());
  // check the first sort's output is ordered in the masked bits
  std::vector<uint64_t> h(std::min<int64_t>(n, 1 << 20));
  CK(cudaMemcpy(h.data(), d_kout, h.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  bool sorted = std::is_sorted(h.begin(), h.end());
  std::printf("{\"n\": %lld, \"bits\": %d, \"value_bytes\": %d, \"temp_bytes\": %zu, \"ms\": %.6f, "
              "\"ms_min\": %.6f, \"ms_max\": %.6f, \"sorted\": %s}\n",
              (long long)n, bits, (int)sizeof(V), temp, ms[2], ms[0], ms[4], sorted ? "true" : "false");
  std::fflush(stdout);
  cudaFree(d_temp);
  cudaFree(d_vin);
  cudaFree(d_vout);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 0;
}

int main() {
  const int64_t nmax = 1ll << 26;
  std::vector<uint64_t> h(nmax);
  std::mt19937_64 rng(1);
  for (auto& k : h) k = rng();
  uint64_t *d_raw, *d_kin, *d_kout;
  CK(cudaMalloc(&d_raw, nmax * sizeof(uint64_t)));
  CK(cudaMalloc(&d_kin, nmax * sizeof(uint64_t)));
  CK(cudaMalloc(&d_kout, nmax * sizeof(uint64_t)));
  CK(cudaMemcpy(d_raw, h.data(), nmax * sizeof(uint64_t), cudaMemcpyHostToDevice));
  for (int lg = 18; lg <= 26; lg += 2) {
    int64_t n = 1ll << lg;
    for (int bits : {16, 20, 24, 28, 32, 40, 48, 64})
      if (run<int32_t>(n, bits, d_raw, d_kin, d_kout)) return 1;
    if (run<int64_t>(n, 64, d_raw, d_kin, d_kout)) return 1;   // torch.sort's pairs, full width
  }
  return 0;
}
