#pragma once

#include <ATen/core/Tensor.h>

namespace graphfeed {

// Row gather: out[i] = src[index[i]] for a contiguous src [N, ...] of any dtype.
// gather_rows allocates the output; gather_rows_into writes a preallocated
// (possibly pinned) contiguous ``out`` [len(index), ...] of src's dtype.
void check_gather_rows_args(const at::Tensor& src, const at::Tensor& index);
void check_gather_rows_out(const at::Tensor& src, const at::Tensor& index, const at::Tensor& out);

}  // namespace graphfeed
