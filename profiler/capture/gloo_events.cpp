// skewlens: gloo's worker-thread events (``gloo:*`` record functions) and nothing else.
//
// gloo runs each collective on a worker thread of its process group inside a USER_SCOPE record
// function named ``gloo:<collective>``. This library registers one global RecordFunction callback for
// that scope only (operators are FUNCTION scope: their record functions are not even created), keeps
// the events whose name starts with ``gloo:`` (name, native thread id, start and end on the
// CLOCK_REALTIME clock that Python's time.time_ns() reads) in a buffer of a fixed capacity, counts
// the ones that did not fit, counts the ones still open (started, not ended: a stop waits for them),
// and hands them to Python through a C interface (ctypes).
#include <ATen/record_function.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Start final : at::ObserverContext {
  int64_t start_ns;
  explicit Start(int64_t t) : start_ns(t) {}
};

struct Event {
  std::string name;
  int64_t thread;
  int64_t start_ns;
  int64_t end_ns;
};

std::mutex mu;
std::vector<Event> events;
size_t capacity = 0;
int64_t dropped = 0;
bool recording = false;
at::CallbackHandle handle = 0;
// gloo events entered and not yet left (a RecordFunction runs the end callbacks it started with, so
// every enter is paired with a leave, even one after the callback was removed)
std::atomic<int64_t> open_now{0};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (name == nullptr || std::strncmp(name, "gloo:", 5) != 0) {
    return nullptr;
  }
  open_now.fetch_add(1, std::memory_order_relaxed);
  return std::make_unique<Start>(now_ns());
}

void leave(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (ctx == nullptr) {
    return;
  }
  const int64_t end = now_ns();
  const int64_t start = static_cast<Start*>(ctx)->start_ns;
  const auto thread = static_cast<int64_t>(syscall(SYS_gettid));
  {
    std::lock_guard<std::mutex> guard(mu);
    if (recording) {
      if (events.size() >= capacity) {
        ++dropped;
      } else {
        events.push_back(Event{fn.name(), thread, start, end});
      }
    }
  }
  // closed only once kept: a stop that sees no event open finds every ended one in the buffer (closed
  // before, a stop could take the lock between the two and drop an event that had ended in time)
  open_now.fetch_sub(1, std::memory_order_release);
}

}  // namespace

extern "C" {

// Start recording into a buffer of ``cap`` events (clearing it); 0 on success, 1 when already on.
int skewlens_gloo_start(int64_t cap) {
  std::lock_guard<std::mutex> guard(mu);
  if (handle != 0) {
    return 1;
  }
  events.clear();
  capacity = cap > 0 ? static_cast<size_t>(cap) : 0;
  dropped = 0;
  recording = true;
  handle = at::addGlobalCallback(at::RecordFunctionCallback(enter, leave)
                                     .needsInputs(false)
                                     .needsOutputs(false)
                                     .needsIds(false)
                                     .scopes({at::RecordScope::USER_SCOPE}));
  return 0;
}

// Stop recording (the callback removed); the number of events kept.
int64_t skewlens_gloo_stop() {
  at::CallbackHandle h = 0;
  {
    std::lock_guard<std::mutex> guard(mu);
    recording = false;
    h = handle;
    handle = 0;
  }
  if (h != 0) {
    at::removeCallback(h);
  }
  std::lock_guard<std::mutex> guard(mu);
  return static_cast<int64_t>(events.size());
}

// gloo events entered and not left yet (while recording): a worker thread can close its event after
// the work completed and woke its waiter.
int64_t skewlens_gloo_open() {
  return std::max<int64_t>(0, open_now.load(std::memory_order_acquire));
}

// Events that did not fit in the buffer.
int64_t skewlens_gloo_dropped() {
  std::lock_guard<std::mutex> guard(mu);
  return dropped;
}

// Event ``i`` (after stop): its name copied into ``name`` (at most ``name_len`` - 1 bytes, NUL
// terminated), thread, start and end; 0 on success, 1 when ``i`` is out of range.
int skewlens_gloo_event(int64_t i, char* name, int64_t name_len, int64_t* thread, int64_t* start_ns,
                        int64_t* end_ns) {
  std::lock_guard<std::mutex> guard(mu);
  if (i < 0 || static_cast<size_t>(i) >= events.size() || name_len <= 0) {
    return 1;
  }
  const Event& e = events[static_cast<size_t>(i)];
  const size_t n = std::min(e.name.size(), static_cast<size_t>(name_len - 1));
  std::memcpy(name, e.name.data(), n);
  name[n] = '\0';
  *thread = e.thread;
  *start_ns = e.start_ns;
  *end_ns = e.end_ns;
  return 0;
}

// Free the buffer.
void skewlens_gloo_clear() {
  std::lock_guard<std::mutex> guard(mu);
  events.clear();
  events.shrink_to_fit();
}

}  // extern "C"
