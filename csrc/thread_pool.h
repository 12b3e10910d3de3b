// A persistent pool of native threads for the constraint core's batch work (mask rows, fills,
// applies), so the hot path never starts a thread and never holds the GIL.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace llmserve {

// LLMSERVE_CONSTRAINT_THREADS when set, else the hardware threads (at most 16).
int default_threads();

// How many forks separate this process from the one that loaded the core (0 there; a forked child
// counts one more than its parent). A child has only the thread that forked: state a thread of
// the parent left mid-way (a pool call, a mask row being computed, a queued completion) will never
// be finished there, and is recognised by the generation it was left in.
uint32_t fork_generation();

// Waking a worker costs microseconds on an idle machine and up to a scheduler slice on a busy one,
// while one thread streams a 128k-token row of logits in ~7 us: a memory-bound call is only worth
// splitting when every thread gets at least this many bytes to touch. 2 MiB (~0.1-0.2 ms of one
// thread's streaming) keeps a single row inline up to a 262,144-token vocabulary (a Llama-3 row is
// 1 MB read and written) and still splits a B=256 fill (8 MB at 128k tokens). Settable for tests
// and tuning.
constexpr int64_t kDefaultMinBytesPerThread = int64_t(2) << 20;
int64_t min_bytes_per_thread();
int64_t set_min_bytes_per_thread(int64_t bytes);  // returns the previous value; <= 0 restores the default

// After a job (or a wake-up) a worker spins this long, with a pause instruction, watching for the
// next job before it sleeps on the condition variable: a call that follows within the budget (the
// next fill or apply of the same decoding step, a benchmark's back-to-back calls) finds it running,
// so a job of tens of microseconds gets its second thread from the start instead of after a
// wake-up that comes when the work is done. Bounded: an idle pool sleeps after this long, it never
// burns a CPU while nothing calls it. Only workers a recent call wanted spin (not the whole pool),
// at most hardware threads - 1 at once (the caller needs a CPU too). A decoding loop that calls
// once per step (milliseconds apart) still pays the wake-up: spinning costs it up to this much CPU
// per pooled call and spinning worker, for nothing. LLMSERVE_CONSTRAINT_SPIN_US when set, else
// this; 0 turns spinning off.
constexpr int64_t kDefaultSpinUs = 200;
int64_t spin_us();
int64_t set_spin_us(int64_t us);  // returns the previous value; < 0 restores the default

// A second thread only pays when it has a CPU of its own. When the CPUs are oversubscribed (other
// processes busy) a spinning worker shares a CPU with the caller or is descheduled holding a task
// the caller then waits for (a scheduler slice, milliseconds). So when a spinning worker sees it
// lost its CPU (a gap of over 50 us between two looks at the clock), or a caller waits that long
// for a joined worker's last task, the pool stops spinning for this long: workers sleep after each
// job, as without spinning, until the window ends. A worker that finds itself on the CPU the
// last caller ran on sleeps at once (it would only keep the caller off its CPU).
// LLMSERVE_CONSTRAINT_SPIN_BACKOFF_US when set, else this; 0 turns both rules off (a worker then
// spins its whole budget wherever it runs).
constexpr int64_t kDefaultSpinBackoffUs = 50'000;
int64_t spin_backoff_us();
int64_t set_spin_backoff_us(int64_t us);  // returns the previous value; < 0 restores the default

// parallel_for hands out task indices from an atomic counter; the calling thread works too. One
// parallel_for at a time (calls from several threads serialise). A call that uses one thread runs
// inline: it neither wakes a worker nor waits for another caller. A pooled call publishes its job
// to the spinning workers (no system call) and wakes sleeping ones only for the threads it still
// lacks; it waits only for the workers that joined while tasks were left, never for a worker that
// wakes after the work is done.
class ThreadPool {
 public:
  explicit ThreadPool(int n);
  ~ThreadPool();
  void parallel_for(int64_t ntasks, const std::function<void(int64_t)>& fn, int max_threads = 0);
  // Threads (the caller included) worth using for memory-bound work touching `bytes` (read and
  // written), at most
  // max_threads (0: the pool).
  int threads_for_bytes(int64_t bytes, int max_threads = 0) const;
  int size() const { return nthreads_; }
  // Counters since the pool started (tests read them, not timings): parallel_for calls that went
  // to the pool; calls that had to wake a sleeping worker (a system call); jobs a worker joined
  // while spinning, i.e. without being woken; and gauges of the workers spinning or asleep now.
  uint64_t dispatches() const { return dispatches_.load(std::memory_order_relaxed); }
  uint64_t wakeups() const { return wakeups_.load(std::memory_order_relaxed); }
  uint64_t spin_joins() const { return spin_joins_.load(std::memory_order_relaxed); }
  // times the pool saw a CPU taken from a thread of its own and stopped spinning for a while
  uint64_t spin_backoffs() const { return spin_backoffs_.load(std::memory_order_relaxed); }
  int spinning() const { return spinning_.load(std::memory_order_relaxed); }
  int sleeping() const { return sleeping_.load(std::memory_order_relaxed); }
  static ThreadPool& global();

 private:
  uint32_t generation_ = fork_generation();  // the process generation whose threads these are
  void worker();
  // spin (bounded by spin_us) until the ticket's generation moves past `seen` or the pool stops;
  // true when it did. Called counted in spinning_.
  bool spin_for_job(uint64_t seen);
  int64_t run_tasks(const std::function<void(int64_t)>* job, int64_t ntasks);  // tasks it ran
  void contended(int64_t now_ns);  // a thread of the pool lost its CPU: stop spinning for a while
  bool backed_off(int64_t now_ns) const;
  bool on_callers_cpu() const;  // this thread runs on the CPU the last caller ran on
  int nthreads_;
  int max_spinning_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one parallel_for at a time
  std::mutex mu_;       // guards the sleeps (cv_) and the caller's wait for joined workers (done_cv_)
  std::condition_variable cv_, done_cv_;
  std::atomic<bool> stop_{false};
  // generation * 2 + 1 while the current call's tasks are open to workers, generation * 2 once
  // every task is claimed: one word, so a worker never pairs one call's generation with another's
  // open flag. Each hot atomic has its own cache line: spinning workers read the ticket while the
  // joined ones take tasks from next_.
  alignas(64) std::atomic<uint64_t> ticket_{0};
  alignas(64) std::atomic<int64_t> next_{0};
  alignas(64) std::atomic<int> active_{0};  // workers inside the current call (joined, or checking the ticket)
  std::atomic<int> slots_{0};               // workers the current call still takes
  std::atomic<bool> caller_waiting_{false};
  const std::function<void(int64_t)>* job_ = nullptr;  // written before the ticket opens
  int64_t ntasks_ = 0;
  alignas(64) std::atomic<int> spinning_{0};
  std::atomic<int> sleeping_{0};
  std::atomic<int64_t> backoff_until_ns_{0};
  std::atomic<int> caller_cpu_{-1};
  std::atomic<uint64_t> dispatches_{0}, wakeups_{0}, spin_joins_{0}, spin_backoffs_{0};
};

}  // namespace llmserve
