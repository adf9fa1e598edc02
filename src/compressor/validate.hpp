// Validation helpers of the compressor layer beyond the backend contract (backend.hpp):
// value checks for gather/save_ring_rows, the compress_insert plan and the ExecContext check.
#pragma once

#include "compressor/backend.hpp"

namespace dsv41kv::detail {

// plan_insert() with an optional latent (compress_insert without latent_out: the latent never
// leaves the fused op). `op` prefixes messages ("insert", "compress_insert").
InsertPlan plan_insert_impl(const InsertArgs& a, bool require_latent, const char* op);
void check_insert_values_impl(const InsertArgs& a, const InsertPlan& p, const char* op);

// The InsertArgs that compress_insert() forwards to its insert half.
InsertArgs insert_half(const CompressInsertArgs& a);
// Plans both halves of compress_insert and checks that they describe the same N and device.
void plan_compress_insert(const CompressInsertArgs& a, CompressPlan& cp, InsertPlan& ip);

// Host value checks (slots in range).
void check_gather_values(const GatherArgs& a, const GatherPlan& p);
void check_save_ring_rows_values(const SaveRingRowsArgs& a, const SaveRingRowsPlan& p);

// ctx.num_threads >= 0.
void check_exec_context(const ExecContext& ctx, const char* op);

}  // namespace dsv41kv::detail
