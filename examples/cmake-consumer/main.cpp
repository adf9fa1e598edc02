// Links the installed library and runs two of its CPU ops: the token-to-request and ring slot
// builders of one step (two requests, one padding row), checked against the SPEC 6.3 rule
// written out here; exit status 0 when every slot agrees.
#include <dsv41kv/device.hpp>
#include <dsv41kv/metadata.hpp>
#include <dsv41kv/records.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
  using dsv41kv::DType;
  using dsv41kv::TensorView;
  std::vector<int32_t> qsl{0, 1, 4};                 // request 0: 1 token, request 1: 3 tokens
  std::vector<int64_t> positions{9, 0, 1, 2, 0};     // the last row is padding
  std::vector<int32_t> ring_blocks{3, 5};            // one ring block per request
  std::vector<int32_t> t2r(5, -7);
  std::vector<int64_t> slots(5, -7);
  const int64_t cap = dsv41kv::ring_capacity(0);

  dsv41kv::TokenToReqArgs a;
  a.qsl = TensorView::contiguous(qsl.data(), DType::I32, {3});
  a.token_to_req = TensorView::contiguous(t2r.data(), DType::I32, {5});
  dsv41kv::build_token_to_req(a);

  dsv41kv::RingSlotArgs r;
  r.token_to_req = a.token_to_req;
  r.positions = TensorView::contiguous(positions.data(), DType::I64, {5});
  r.ring_block_table = TensorView::contiguous(ring_blocks.data(), DType::I32, {2, 1});
  r.num_actual_tokens = 4;
  r.cap = cap;
  r.ring_slots = TensorView::contiguous(slots.data(), DType::I64, {5});
  dsv41kv::build_ring_slots(r);

  int bad = 0;
  for (int t = 0; t < 5; ++t) {
    const int64_t want = t < 4 ? ring_blocks[t2r[t]] * cap + positions[t] % cap : -1;
    if (slots[t] != want) {
      std::printf("token %d: ring slot %lld, expected %lld\n", t, (long long)slots[t], (long long)want);
      ++bad;
    }
  }
  std::printf("dsv41kv consumer: %s, CUDA backend %s; ring slots %s\n",
              dsv41kv::cuda_device_description().c_str(), dsv41kv::built_with_cuda() ? "built" : "not built",
              bad ? "WRONG" : "ok");
  return bad ? 1 : 0;
}
