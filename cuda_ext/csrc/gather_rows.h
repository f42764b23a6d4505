#pragma once

#include <ATen/core/Tensor.h>

namespace graphfeed {

// Row gather: out[i] = src[index[i]] for a contiguous src [N, ...] of any dtype.
// gather_rows allocates the output; gather_rows_into writes a preallocated
// (possibly pinned) contiguous ``out`` [len(index), ...] of src's dtype.
void check_gather_rows_args(const at::Tensor& src, const at::Tensor& index);
void check_gather_rows_out(const at::Tensor& src, const at::Tensor& index, const at::Tensor& out);

// empty_rows(like, rows): an uninitialised [rows, like.shape[1:]] tensor of like's dtype, for rows that
// are about to be written (gather_rows_to); multi-MB ones on transparent huge pages (see the CPU kernel).

// Row scatter-gather: out[out_index[i]] = src[index[i]] (index absent: src[i]), one copy per row
// where a gather followed by index_copy_ makes two.  ``out`` [M, ...] has src's row shape and dtype.
void check_gather_rows_to_args(const at::Tensor& src, const c10::optional<at::Tensor>& index, const at::Tensor& out,
                               const at::Tensor& out_index);

}  // namespace graphfeed
