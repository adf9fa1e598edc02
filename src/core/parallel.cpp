// The worker pool behind parallel_for (parallel.hpp).
#include "core/parallel.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

namespace dsv41kv::detail {
namespace {

// One run_parts call: its parts, how many are still running, the first exception of each part.
struct Job {
  const std::function<void(int)>* part = nullptr;
  std::atomic<int> left{0};
  std::vector<std::exception_ptr> errors;
};

class Pool {
 public:
  static Pool& instance() {
    static Pool pool;
    return pool;
  }

  void run(int parts, const std::function<void(int)>& part) {
    Job job;
    job.part = &part;
    job.left.store(parts, std::memory_order_relaxed);
    job.errors.resize(static_cast<size_t>(parts));
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (static_cast<int>(workers_.size()) < parts - 1) workers_.emplace_back([this] { work(); });
      for (int i = 1; i < parts; ++i) queue_.push_back({&job, i});
      queued_.fetch_add(parts - 1, std::memory_order_release);
    }
    wake_.notify_all();
    execute({&job, 0});
    // wait for the other parts, running queued ones (this job's or others') meanwhile
    while (job.left.load(std::memory_order_acquire) > 0) {
      Task t;
      if (pop(t)) {
        execute(t);
        continue;
      }
      std::unique_lock<std::mutex> lock(mu_);
      done_.wait_for(lock, std::chrono::microseconds(50),
                     [&] { return job.left.load(std::memory_order_acquire) == 0 || !queue_.empty(); });
    }
    for (auto& e : job.errors)
      if (e) std::rethrow_exception(e);
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true, std::memory_order_relaxed);
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }

 private:
  struct Task {
    Job* job;
    int index;
  };

  bool pop(Task& t) {
    if (queued_.load(std::memory_order_acquire) == 0) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.empty()) return false;
    t = queue_.front();
    queue_.pop_front();
    queued_.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }

  void execute(Task t) {
    try {
      (*t.job->part)(t.index);
    } catch (...) {
      t.job->errors[static_cast<size_t>(t.index)] = std::current_exception();
    }
    if (t.job->left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);  // the waiter checks `left` under the lock
      done_.notify_all();
    }
  }

  void work() {
    for (;;) {
      Task t;
      // spin briefly for the next call's parts before sleeping
      const auto spin_end = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
      bool got = false;
      while (!(got = pop(t)) && std::chrono::steady_clock::now() < spin_end && !stop_.load(std::memory_order_relaxed))
        std::this_thread::yield();
      if (!got) {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_.load(std::memory_order_relaxed) || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping
        t = queue_.front();
        queue_.pop_front();
        queued_.fetch_sub(1, std::memory_order_relaxed);
      }
      execute(t);
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::deque<Task> queue_;
  std::atomic<int> queued_{0};
  std::vector<std::thread> workers_;
  std::atomic<bool> stop_{false};
};

}  // namespace

void run_parts(int parts, const std::function<void(int)>& part) { Pool::instance().run(parts, part); }

}  // namespace dsv41kv::detail
