// Seeded workload of the PCP simulation: requests, ring blocks and a chunked-prefill schedule
// that does not depend on P (so every P replays the same global steps).
#include <fmt/format.h>

#include <algorithm>
#include <deque>

#include "dsv41kv/pcp_sim.hpp"
#include "dsv41kv/rng.hpp"

namespace dsv41kv::pcp {

void validate(const WorkloadConfig& c) {
  auto bad = [](const char* field, int64_t v, const char* expected) {
    invalid_argument(fmt::format("workload: {} = {} (expected {})", field, v, expected));
  };
  if (c.num_requests < 1 || c.num_requests > 100000) bad("num_requests", c.num_requests, "1..100000");
  if (c.prompt_min < 1) bad("prompt_min", c.prompt_min, ">= 1");
  if (c.prompt_max < c.prompt_min || c.prompt_max > (1 << 24))
    bad("prompt_max", c.prompt_max, "prompt_min..2^24");
  if (c.start_min < 0) bad("start_min", c.start_min, ">= 0");
  if (c.start_max < c.start_min || c.start_max > (1 << 24))
    bad("start_max", c.start_max, "start_min..2^24");
  if (c.decode_steps < 0 || c.decode_steps > (1 << 20)) bad("decode_steps", c.decode_steps, "0..2^20");
  if (c.chunk_budget < 1) bad("chunk_budget", c.chunk_budget, ">= 1");
  if (c.max_num_seqs < 1 || c.max_num_seqs > 65536) bad("max_num_seqs", c.max_num_seqs, "1..65536");
  if (!(c.null_block_fraction >= 0.0 && c.null_block_fraction <= 1.0))
    invalid_argument(fmt::format("workload: null_block_fraction = {} (expected 0..1)", c.null_block_fraction));
  if (c.graph_pad_multiple < 0 || c.graph_pad_multiple > (1 << 16))
    bad("graph_pad_multiple", c.graph_pad_multiple, "0..2^16");
  if (c.max_steps < 0) bad("max_steps", c.max_steps, ">= 0");
}

Workload generate_workload(const WorkloadConfig& c) {
  validate(c);
  Workload w;
  w.config = c;
  Rng rng(c.seed);
  const int64_t n = c.num_requests;
  // Distinct ring blocks 1..n, shuffled; null-block requests get 0.
  std::vector<int32_t> blocks(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) blocks[static_cast<size_t>(i)] = static_cast<int32_t>(i + 1);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(blocks[static_cast<size_t>(i)], blocks[static_cast<size_t>(rng.integer(0, i))]);
  for (int64_t i = 0; i < n; ++i) {
    Workload::Request r;
    r.start = rng.integer(c.start_min, c.start_max);
    r.prompt_len = rng.integer(c.prompt_min, c.prompt_max);
    r.decode_steps = c.decode_steps;
    r.null_block = rng.unit() < c.null_block_fraction;
    r.ring_block = r.null_block ? 0 : blocks[static_cast<size_t>(i)];
    w.max_position = std::max(w.max_position, r.start + r.prompt_len + r.decode_steps - 1);
    w.requests.push_back(r);
  }

  // Scheduler: admission in id order up to max_num_seqs running; per step decodes first (one
  // token each), then prefills in admission order, each taking what is left of the budget.
  struct Live {
    int32_t id;
    int64_t computed;
    int64_t prompt_end;
    int64_t decodes_done;
  };
  std::deque<int32_t> waiting;
  for (int64_t i = 0; i < n; ++i) waiting.push_back(static_cast<int32_t>(i));
  std::vector<Live> running;
  while (!waiting.empty() || !running.empty()) {
    if (c.max_steps > 0 && static_cast<int64_t>(w.steps.size()) >= c.max_steps) break;
    while (!waiting.empty() && static_cast<int64_t>(running.size()) < c.max_num_seqs) {
      const int32_t id = waiting.front();
      waiting.pop_front();
      const auto& r = w.requests[static_cast<size_t>(id)];
      running.push_back({id, r.start, r.start + r.prompt_len, 0});
    }
    int64_t budget = c.jitter_budget ? rng.integer(1, c.chunk_budget) : c.chunk_budget;
    std::vector<ScheduledRequest> step;
    std::vector<int64_t> q(running.size(), 0);
    for (size_t i = 0; i < running.size(); ++i) {
      const Live& l = running[i];
      if (l.computed >= l.prompt_end && l.decodes_done < w.requests[static_cast<size_t>(l.id)].decode_steps) {
        q[i] = 1;
        budget -= 1;
        step.push_back({l.id, {1, l.computed, false}});
      }
    }
    for (size_t i = 0; i < running.size(); ++i) {
      const Live& l = running[i];
      if (l.computed >= l.prompt_end || budget <= 0) continue;
      q[i] = std::min(l.prompt_end - l.computed, budget);
      budget -= q[i];
      step.push_back({l.id, {q[i], l.computed, true}});
    }
    if (step.empty()) {
      // Only requests with nothing left (prompt done, no decodes): retire them.
      running.clear();
      continue;
    }
    w.steps.push_back(std::move(step));
    std::vector<Live> next;
    for (size_t i = 0; i < running.size(); ++i) {
      Live l = running[i];
      const bool decode = l.computed >= l.prompt_end;
      l.computed += q[i];
      if (decode && q[i] > 0) l.decodes_done += 1;
      const bool done = l.computed >= l.prompt_end &&
                        l.decodes_done >= w.requests[static_cast<size_t>(l.id)].decode_steps;
      if (!done) next.push_back(l);
    }
    running = std::move(next);
  }
  return w;
}

}  // namespace dsv41kv::pcp
