// Which row of an input a row of SkipRMSNorm's output reads. X and skip broadcast against each
// other over the dims before the normalized ones (numpy's rules: a dim of 1, or a missing one, is
// read again at every index of the other's), so each has a map from the output's rows to its own.
// Plain C++, for the CPU rows, the CUDA kernels (host and device) and the emulation alike.
#pragma once

#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define RMSNORM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define RMSNORM_HOST_DEVICE inline
#endif

namespace rmsnorm_onnx {

inline constexpr int kMaxRowDims = 8;

struct RowMap {
  int64_t rows = 1;  // the rows the input holds
  // rank 0: output row r reads row r % rows: the input is the output's trailing rows, repeated
  // (a full-size input, or one that drops or sets to 1 only leading dims: the common cases).
  // Otherwise the output's leading dims, runs of dims that broadcast alike merged into one, and
  // the input's row stride along each (0 where the input broadcasts).
  int32_t rank = 0;
  int64_t dims[kMaxRowDims] = {};
  int64_t strides[kMaxRowDims] = {};
};

RMSNORM_HOST_DEVICE int64_t MapRow(const RowMap& m, int64_t row) {
  // A GPU has no 64-bit divide: `%` is a ~100-instruction routine, paid per row (and twice for
  // SkipRMSNorm) before a row's first load. A full-size input (every row < its rows) skips it.
  if (m.rank == 0) return row < m.rows ? row : row % m.rows;
  int64_t at = 0;
  for (int i = m.rank - 1; i >= 0; --i) {
    at += (row % m.dims[i]) * m.strides[i];
    row /= m.dims[i];
  }
  return at;
}

// Whether output row r reads input row r (the map is the identity on `rows` output rows).
RMSNORM_HOST_DEVICE bool IsIdentity(const RowMap& m, int64_t rows) {
  return m.rank == 0 && m.rows == rows;
}

// The map of an input whose leading dims are `in` (right-aligned to `out`, missing ones 1) onto
// output leading dims `out`, which `in` broadcasts to (the caller checked). False when more than
// kMaxRowDims runs remain after merging (dims alternating between read and broadcast that often).
inline bool MakeRowMap(const std::vector<int64_t>& out, const std::vector<int64_t>& in,
                       RowMap* map) {
  *map = RowMap{};
  const size_t pad = out.size() - in.size();
  int64_t dims[kMaxRowDims];
  bool read[kMaxRowDims];  // false: the input broadcasts along this run
  int runs = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 1) continue;  // a dim of 1 moves no row
    const bool r = i >= pad && in[i - pad] != 1;
    if (runs > 0 && read[runs - 1] == r) {
      dims[runs - 1] *= out[i];
    } else if (runs == kMaxRowDims) {
      return false;  // (no array on the heap: a call of the op allocates nothing here)
    } else {
      dims[runs] = out[i];
      read[runs++] = r;
    }
    if (r) map->rows *= out[i];
  }
  // runs alternate: rank 0 (r % rows) serves one run, or a broadcast run then a read one
  if (runs <= 1 || (runs == 2 && !read[0])) return true;
  map->rank = runs;
  int64_t stride = 1;
  for (int i = runs; i-- > 0;) {
    map->dims[i] = dims[i];
    map->strides[i] = read[i] ? stride : 0;
    if (read[i]) stride *= dims[i];
  }
  return true;
}

}  // namespace rmsnorm_onnx
