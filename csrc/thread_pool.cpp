#include "thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>

#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace llmserve {

namespace {
std::atomic<int64_t> g_min_bytes_per_thread{kDefaultMinBytesPerThread};

// microseconds from the environment variable `name` when it holds a whole number >= 0, else `fallback`
int64_t env_us(const char* name, int64_t fallback) {
  if (const char* env = std::getenv(name)) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (end != env && v >= 0) return v;
  }
  return fallback;
}
std::atomic<int64_t> g_spin_us{env_us("LLMSERVE_CONSTRAINT_SPIN_US", kDefaultSpinUs)};
std::atomic<int64_t> g_spin_backoff_us{env_us("LLMSERVE_CONSTRAINT_SPIN_BACKOFF_US", kDefaultSpinBackoffUs)};

// A thread that goes this long between two looks at the clock, or a caller that waits this long
// for a joined worker's last task (beyond a few of its own tasks' time), lost a CPU to someone.
constexpr int64_t kPreemptedNs = 50'000;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline int current_cpu() {
#if defined(__linux__)
  return sched_getcpu();
#else
  return -1;
#endif
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  std::this_thread::yield();
#endif
}

// The caller's wait for the workers that joined: each is on its last task (microseconds) unless
// the scheduler took its CPU; spin this many pauses, then sleep on the condition variable.
constexpr int kCallerSpins = 1024;
}  // namespace

int64_t min_bytes_per_thread() { return g_min_bytes_per_thread.load(std::memory_order_relaxed); }

int64_t set_min_bytes_per_thread(int64_t bytes) {
  return g_min_bytes_per_thread.exchange(bytes > 0 ? bytes : kDefaultMinBytesPerThread);
}

int64_t spin_us() { return g_spin_us.load(std::memory_order_relaxed); }

int64_t set_spin_us(int64_t us) { return g_spin_us.exchange(us >= 0 ? us : kDefaultSpinUs); }

int64_t spin_backoff_us() { return g_spin_backoff_us.load(std::memory_order_relaxed); }

int64_t set_spin_backoff_us(int64_t us) {
  return g_spin_backoff_us.exchange(us >= 0 ? us : kDefaultSpinBackoffUs);
}

void ThreadPool::contended(int64_t now) {
  const int64_t backoff = spin_backoff_us();
  if (backoff <= 0) return;
  backoff_until_ns_.store(now + backoff * 1000, std::memory_order_relaxed);
  spin_backoffs_.fetch_add(1, std::memory_order_relaxed);
}

bool ThreadPool::on_callers_cpu() const {
  const int cpu = current_cpu();
  return cpu >= 0 && cpu == caller_cpu_.load(std::memory_order_relaxed);
}

bool ThreadPool::backed_off(int64_t now) const {
  return now < backoff_until_ns_.load(std::memory_order_relaxed) && spin_backoff_us() > 0;
}

ThreadPool::ThreadPool(int n) : nthreads_(std::max(1, n)) {
  // the caller needs a CPU too: more spinning workers than the other hardware threads would take
  // CPUs from the threads doing the work
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  max_spinning_ = std::max(0, std::min(nthreads_ - 1, hw - 1));
  for (int i = 1; i < nthreads_; ++i) workers_.emplace_back([this] { worker(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  { std::lock_guard<std::mutex> lk(mu_); }  // a worker checking its predicate is now waiting
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

bool ThreadPool::spin_for_job(uint64_t seen) {
  const int64_t budget = spin_us();
  if (budget <= 0) return false;
  int64_t last = now_ns();
  if (backed_off(last)) return false;
  const int64_t deadline = last + budget * 1000;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if ((ticket_.load(std::memory_order_acquire) >> 1) != seen || stop_.load(std::memory_order_relaxed))
        return true;
      cpu_relax();
    }
    // A worker the scheduler put on the caller's CPU would keep the caller (the one thread that can
    // publish the next job) off it for the whole budget: it sleeps instead. (With the back-off
    // off, spin_backoff_us 0, a worker spins its whole budget wherever it runs.)
    const bool careful = spin_backoff_us() > 0;
    if (careful && on_callers_cpu()) return false;
    const int64_t now = now_ns();
    if (careful && now - last > kPreemptedNs) {
      contended(now);  // someone else ran meanwhile: the CPUs are oversubscribed
      return false;
    }
    if (now >= deadline) return false;
    last = now;
  }
}

void ThreadPool::worker() {
  uint64_t seen = 0;  // the last generation this worker looked at
  // Spin after a call only when this worker was wanted: it joined, or a call woke it, or it
  // arrived after the caller had done every task. A spinning worker that finds a call with no slot
  // left for it sleeps instead: the workers that spin are the ones recent calls use, not the
  // whole pool (16 threads spinning in a container with a 2-CPU quota would eat the quota).
  bool may_spin = false;
  for (;;) {
    // Every atomic below is sequentially consistent where two threads must see each other: a
    // worker going to sleep counts itself asleep before it rereads the ticket, a caller opens the
    // ticket before it counts the sleeping workers, so either the worker sees the job or the
    // caller wakes it.
    bool spun = false, found = false;
    if (may_spin) {
      if (spinning_.fetch_add(1) < max_spinning_) {
        spun = true;
        found = spin_for_job(seen);
        if (found) spinning_.fetch_sub(1);
      } else {
        spinning_.fetch_sub(1);
      }
    }
    if (!found) {
      std::unique_lock<std::mutex> lk(mu_);
      sleeping_.fetch_add(1);
      if (spun) spinning_.fetch_sub(1);
      cv_.wait(lk, [&] { return stop_.load() || (ticket_.load() >> 1) != seen; });
      sleeping_.fetch_sub(1);
    }
    if (stop_.load()) return;
    may_spin = true;
    const uint64_t t = ticket_.load();
    seen = t >> 1;
    if (!(t & 1)) continue;  // every task already claimed: the work was done without this worker
    // inside the call before looking at it again: the caller, which closes the ticket before it
    // reads active_, either sees this worker or this worker sees the ticket closed
    active_.fetch_add(1);
    if (ticket_.load() == t) {
      if (slots_.fetch_sub(1) > 0) {
        if (found) spin_joins_.fetch_add(1, std::memory_order_relaxed);
        run_tasks(job_, ntasks_);
      } else if (found) {
        may_spin = false;  // the call has all the threads it wants without this one
      }
    }
    if (active_.fetch_sub(1) == 1 && caller_waiting_.load()) {
      std::lock_guard<std::mutex> lk(mu_);
      done_cv_.notify_all();
    }
  }
}

int64_t ThreadPool::run_tasks(const std::function<void(int64_t)>* job, int64_t ntasks) {
  for (int64_t ran = 0;; ++ran) {
    int64_t t = next_.fetch_add(1, std::memory_order_relaxed);
    if (t >= ntasks) return ran;
    (*job)(t);
  }
}

void ThreadPool::parallel_for(int64_t ntasks, const std::function<void(int64_t)>& fn, int max_threads) {
  if (ntasks <= 0) return;
  const int use = static_cast<int>(
      std::min<int64_t>(std::min(nthreads_, max_threads <= 0 ? nthreads_ : max_threads), ntasks));
  if (use <= 1) {
    for (int64_t t = 0; t < ntasks; ++t) fn(t);
    return;
  }
  std::lock_guard<std::mutex> one_at_a_time(call_mu_);
  dispatches_.fetch_add(1, std::memory_order_relaxed);
  caller_cpu_.store(current_cpu(), std::memory_order_relaxed);
  job_ = &fn;
  ntasks_ = ntasks;
  next_.store(0, std::memory_order_relaxed);
  slots_.store(use - 1, std::memory_order_relaxed);
  const uint64_t gen = (ticket_.load(std::memory_order_relaxed) >> 1) + 1;
  ticket_.store(gen * 2 + 1);  // open: publishes job_, ntasks_, next_ and slots_
  // A worker not counted asleep (spinning, finishing the previous call, or on its way to sleep)
  // looks at the ticket before it sleeps: it takes the job by itself. Wake sleeping ones only for
  // the threads still missing.
  const int asleep = sleeping_.load();
  const int wake = std::min(asleep, use - 1 - (nthreads_ - 1 - asleep));
  if (wake > 0) {
    wakeups_.fetch_add(1, std::memory_order_relaxed);
    { std::lock_guard<std::mutex> lk(mu_); }  // a worker checking its predicate is now waiting
    if (wake >= asleep) {
      cv_.notify_all();
    } else {
      for (int i = 0; i < wake; ++i) cv_.notify_one();
    }
  }
  // fn must outlive every worker that joined, also when a task throws here (an allocation failure)
  std::exception_ptr failed;
  const int64_t start = now_ns();
  int64_t ran = 0;
  try {
    ran = run_tasks(&fn, ntasks);
  } catch (...) {
    failed = std::current_exception();
    next_.store(ntasks, std::memory_order_relaxed);  // the workers stop at their next task
  }
  ticket_.store(gen * 2);  // closed: every task is claimed, a worker arriving now has nothing to do
  if (active_.load() != 0) {
    const int64_t ran_until = now_ns();
    bool done = false;
    for (int i = 0; i < kCallerSpins && !done; ++i) {
      done = active_.load() == 0;
      if (!done) cpu_relax();
    }
    if (!done) {
      caller_waiting_.store(true);
      std::unique_lock<std::mutex> lk(mu_);
      done_cv_.wait(lk, [&] { return active_.load() == 0; });
      caller_waiting_.store(false);
    }
    // a joined worker's last task should take about what one of the caller's took: waiting much
    // longer means its thread lost the CPU while holding it
    const int64_t end = now_ns(), task = ran > 0 ? (ran_until - start) / ran : 0;
    if (end - ran_until > std::max(kPreemptedNs, 4 * task)) contended(end);
  }
  if (failed) std::rethrow_exception(failed);
}

int ThreadPool::threads_for_bytes(int64_t bytes, int max_threads) const {
  const int cap = max_threads <= 0 ? nthreads_ : std::min(nthreads_, max_threads);
  const int64_t want = std::max<int64_t>(1, bytes / std::max<int64_t>(1, min_bytes_per_thread()));
  return static_cast<int>(std::min<int64_t>(cap, want));
}

namespace {
// The process's pool, never destroyed: see global().
std::atomic<ThreadPool*> g_pool{nullptr};
std::atomic<uint32_t> g_fork_generation{0};
// Registered when the core is loaded, so that every fork counts, also one before the pool's
// first use (a grammar row computed on a calling thread is left mid-way just the same).
const bool g_counting_forks = [] {
#if defined(__unix__) || defined(__APPLE__)
  pthread_atfork(nullptr, nullptr, [] { g_fork_generation.fetch_add(1, std::memory_order_relaxed); });
#endif
  return true;
}();
}  // namespace

uint32_t fork_generation() { return g_fork_generation.load(std::memory_order_acquire); }

ThreadPool& ThreadPool::global() {
  ThreadPool* pool = g_pool.load(std::memory_order_acquire);
  const uint32_t generation = fork_generation();
  if (pool != nullptr && pool->generation_ == generation) return *pool;
  // First use, or first use in a child forked from a process that had a pool. A child has only
  // the thread that forked: the pool's workers are gone, and its counters and locks are as they
  // were at the fork, possibly mid-call (a call waiting for a worker that will never finish
  // would hang the child, as would a lock held by a thread that was not copied). The child gets a
  // pool of its own, and the inherited one is never touched again, nor destroyed: its destructor
  // would join threads that do not exist in this process. No pool is destroyed at exit either:
  // its sleeping workers end with the process.
  auto* fresh = new ThreadPool(default_threads());
  while (!g_pool.compare_exchange_weak(pool, fresh, std::memory_order_acq_rel)) {
    if (pool != nullptr && pool->generation_ == generation) {  // another thread installed this generation's
      delete fresh;  // its workers exist: joining them is fine
      return *pool;
    }
  }
  return *fresh;
}

int default_threads() {
  if (const char* env = std::getenv("LLMSERVE_CONSTRAINT_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::max(1u, std::min(hw, 16u)));
}

}  // namespace llmserve
