// run_worker_rank (pcp_sim.hpp): one rank of a multi-process PCP run, verified step by step
// against a CPU run of every rank in the same process.
#include <fmt/format.h>

#include <memory>

#include "dsv41kv/pcp_sim.hpp"

namespace dsv41kv::pcp {

WorkerResult run_worker_rank(const SimConfig& cfg, const Workload& w, Communicator& comm,
                             const WorkerOptions& opt) {
  WorkerResult res;
  res.rank = comm.rank();
  res.P = comm.size();
  Simulation mine(cfg, w, res.P, /*with_reference=*/false, &comm);
  std::unique_ptr<Simulation> cpu;
  if (opt.verify) {
    SimConfig rc = cfg;
    rc.device = Device::CPU;
    cpu = std::make_unique<Simulation>(rc, w, res.P, /*with_reference=*/true);
  }
  const auto k = static_cast<size_t>(res.rank);
  for (int64_t i = 0; i < mine.num_steps(); ++i) {
    comm.barrier();
    if (opt.at_step_start) opt.at_step_start(i);
    WorkerStep st;
    st.rank = res.rank;
    st.report = mine.run_step(i);
    st.sent = st.report.measured_sent[k];
    st.received = st.report.measured_received[k];
    st.expected = st.report.volume[k];
    st.device_ms = st.report.device_ms[k];
    ++res.steps_run;
    res.sent += st.sent;
    res.received += st.received;
    res.expected += st.expected;
    res.device_ms += st.device_ms;
    if (opt.on_step) opt.on_step(st);
    if (st.sent != st.expected.sent() || st.received != st.expected.received())
      res.first_mismatch = Mismatch{i, res.rank, "comm counters", 0,
                                    fmt::format("moved sent {} / received {} bytes, SPEC 7.7 expects {} / {}", st.sent,
                                                st.received, st.expected.sent(), st.expected.received())};
    if (cpu) {
      cpu->run_step(i);
      auto spec = cpu->check_step(&res.cpu_vs_references);
      if (spec && !res.first_mismatch) res.first_mismatch = spec;
      auto own = mine.compare_rank(*cpu, &res.rank_vs_cpu);
      if (own && !res.first_mismatch) res.first_mismatch = own;
    }
    if (res.first_mismatch) break;
  }
  return res;
}

}  // namespace dsv41kv::pcp
