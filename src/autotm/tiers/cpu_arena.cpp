// A CPU allocator that puts the tensors a plan names at their planned offsets in one
// arena (see cpu_arena.py for why). Everything else passes through to the allocator that
// was installed before, untouched.
//
// PyTorch's CPU allocator is process-wide (c10::SetCPUAllocator), so this is one object
// for the process; arenas are created and retired by the executors that use them.
#include <torch/extension.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace {

constexpr size_t kHugePage = size_t(2) << 20;

struct Arena {
  char* base = nullptr;
  size_t size = 0;
  char* mapping = nullptr;  // what mmap returned (base is it rounded up to a huge page)
  size_t mapped = 0;
  bool retired = false;
  std::map<size_t, size_t> live;  // offset -> length of the blocks handed out
  size_t live_bytes = 0;
  size_t high = 0;  // the end of the highest block ever handed out: no page above it was touched
  // per huge page: given back by trim() and no block handed out over it since (so not
  // resident: trimming it again would release nothing)
  std::vector<uint8_t> released;

  void add_block(size_t off, size_t len) {
    live.emplace(off, len);
    high = std::max(high, off + len);
    if (released.empty() || len == 0) return;
    for (size_t i = off / kHugePage, e = (off + len - 1) / kHugePage; i <= e && i < released.size(); ++i)
      released[i] = 0;
  }

  bool holds(const void* p) const {
    auto c = static_cast<const char*>(p);
    return c >= base && c < base + size;
  }
  // The lowest page-aligned free range of len bytes that avoids `reserved` ([off, end)
  // ranges: outputs expected from the running kernel), or SIZE_MAX.
  size_t first_fit(size_t len, const std::vector<std::pair<size_t, size_t>>& reserved) const {
    const size_t page = 4096;
    size_t cand = 0;
    auto it = live.begin();
    for (;;) {
      cand = (cand + page - 1) / page * page;
      if (cand + len > size) return SIZE_MAX;
      while (it != live.end() && it->first + it->second <= cand) ++it;
      if (it != live.end() && it->first < cand + len) {
        cand = it->first + it->second;
        continue;
      }
      bool moved = false;
      for (auto& r : reserved) {
        if (r.first < cand + len && cand < r.second) {
          cand = r.second;
          moved = true;
          break;
        }
      }
      if (!moved) return cand;
    }
  }

  // [off, off + len) overlaps no live block
  bool is_free(size_t off, size_t len) const {
    if (off + len > size) return false;
    auto it = live.lower_bound(off);
    if (it != live.end() && it->first < off + len) return false;
    if (it != live.begin() && std::prev(it)->first + std::prev(it)->second > off) return false;
    return true;
  }
};

std::mutex mu;
std::map<int64_t, Arena*> arenas;  // live and retired-with-blocks arenas
int64_t next_id = 1;
Arena* expecting = nullptr;                    // the arena the expected sizes are for
struct Expected {
  size_t nbytes, offset;
  int64_t skip;  // allocations of this size to let pass first (learned: temporaries of the kernel)
};
std::vector<Expected> expected;
std::vector<std::pair<int64_t, int64_t>> alloc_log;  // (nbytes, address) of each allocation while expecting
// Allocations of at least this many bytes that no entry wants (a kernel's temporaries) go
// to a free range of the arena while expecting, if one avoids the expected outputs: the
// budget's unused bytes at that kernel, instead of new heap pages.
size_t temporaries_min = 0;  // 0: never
int64_t temporaries_placed = 0;
int64_t placed = 0, passed = 0;
// The pool (an arena of its own, set by use_pool): allocations of at least pool_min bytes
// that no expected slot takes go to its lowest free range instead of glibc's heap. Its
// pages stay resident up to the high-water mark of what is alive there at once, whatever
// the heap looked like before, so a budget's bound on RSS needs few trims and the kernels
// fault nothing back in (glibc's heap, fragmented by what ran before in the process,
// spread them over pages a trim had given back: ~80-200k page faults an iteration on
// densenet264 at the cpu preset).
Arena* pool = nullptr;
size_t pool_min = 0;
int64_t pooled = 0;
c10::Allocator* previous = nullptr;

// Called with mu held: a block of n bytes from the pool, or nullptr (no pool, too small, full).
void* pool_take_locked(size_t n) {
  if (pool == nullptr || n < pool_min) return nullptr;
  size_t off = pool->first_fit(n, {});
  if (off == SIZE_MAX) return nullptr;
  pool->add_block(off, n);
  pool->live_bytes += n;
  ++pooled;
  return pool->base + off;
}

// Watching (the profiler, one kernel call at a time): every CPU allocation counts, ours
// or the previous allocator's, until freed; the peak of the bytes alive since watch()
// began is a kernel's footprint. A block freed in a later window does not count there
// (its generation).
bool watching = false;
int64_t watch_gen = 0, watch_cur = 0, watch_peak = 0;
std::unordered_map<void*, std::pair<int64_t, int64_t>> watched;  // address -> (bytes, generation)

// Called with mu held, for a block given back: its bytes leave the watched count.
void unwatch_locked(void* p) {
  if (watched.empty()) return;
  auto w = watched.find(p);
  if (w == watched.end()) return;
  if (w->second.second == watch_gen) watch_cur -= w->second.first;
  watched.erase(w);
}

void unmap(Arena* a) {
  munmap(a->mapping, a->mapped);
  delete a;
}

// Called with mu held: give back the block at p, and the arena once retired and empty.
bool release_locked(void* p) {
  for (auto it = arenas.begin(); it != arenas.end(); ++it) {
    Arena* a = it->second;
    if (!a->holds(p)) continue;
    auto b = a->live.find(static_cast<char*>(p) - a->base);
    if (b != a->live.end()) {
      a->live_bytes -= b->second;
      a->live.erase(b);
    }
    if (a->retired && a->live.empty()) {
      arenas.erase(it);
      unmap(a);
    }
    return true;
  }
  return false;
}

void arena_delete(void* p) {
  std::lock_guard<std::mutex> g(mu);
  unwatch_locked(p);
  release_locked(p);
}

// The raw deleter for raw_allocate's pointers: ours or the previous allocator's.
void any_delete(void* p) {
  {
    std::lock_guard<std::mutex> g(mu);
    unwatch_locked(p);
    if (release_locked(p)) return;
  }
  previous->raw_deleter()(p);
}

struct PlannedAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    if (n > 0) {
      std::lock_guard<std::mutex> g(mu);
      if (expecting != nullptr) {
        bool output_size = false;
        for (auto& e : expected) {
          // (the entry stays: a kernel may allocate a temporary of its output's size first,
          // and free it before the output comes; a live one keeps the range busy)
          if (e.nbytes != n) continue;
          if (e.skip > 0) {  // a temporary of the output's size, known from an earlier call
            --e.skip;
            continue;
          }
          output_size = true;
          if (expecting->is_free(e.offset, n)) {
            expecting->add_block(e.offset, n);
            expecting->live_bytes += n;
            ++placed;
            void* p = expecting->base + e.offset;
            alloc_log.emplace_back(n, reinterpret_cast<int64_t>(p));
            return {p, p, &arena_delete, c10::Device(c10::DeviceType::CPU)};
          }
        }
        // (an allocation of an expected output's size, not a known temporary, whose slot is
        // busy may be that output, which outlives the kernel: never a temporary's free
        // pages, where it would hold bytes the layout gives to later tensors; the heap, and
        // the executor copies it into its slot and learns the skip)
        if (temporaries_min > 0 && n >= temporaries_min && !output_size) {
          std::vector<std::pair<size_t, size_t>> reserved;
          for (auto& e : expected) reserved.emplace_back(e.offset, e.offset + e.nbytes);
          size_t off = expecting->first_fit(n, reserved);
          if (off != SIZE_MAX) {
            expecting->add_block(off, n);
            expecting->live_bytes += n;
            ++temporaries_placed;
            void* p = expecting->base + off;
            alloc_log.emplace_back(n, reinterpret_cast<int64_t>(p));
            return {p, p, &arena_delete, c10::Device(c10::DeviceType::CPU)};
          }
        }
        ++passed;
        if (void* p = pool_take_locked(n)) {
          alloc_log.emplace_back(n, reinterpret_cast<int64_t>(p));
          return {p, p, &arena_delete, c10::Device(c10::DeviceType::CPU)};
        }
        c10::DataPtr d = previous->allocate(n);
        alloc_log.emplace_back(n, reinterpret_cast<int64_t>(d.get()));
        return d;
      }
      if (!watching) {
        if (void* p = pool_take_locked(n)) return {p, p, &arena_delete, c10::Device(c10::DeviceType::CPU)};
      }
    }
    if (n > 0 && watching) {
      c10::DataPtr d = previous->allocate(n);
      // a plain block (data is its context, freed by the raw deleter, as c10's default
      // allocator's are): counted until any_delete sees it go
      if (d.get() == d.get_context() && d.get_deleter() == previous->raw_deleter()) {
        void* p = d.release_context();
        std::lock_guard<std::mutex> g(mu);
        watched[p] = {static_cast<int64_t>(n), watch_gen};
        watch_cur += n;
        if (watch_cur > watch_peak) watch_peak = watch_cur;
        return {p, p, &any_delete, c10::Device(c10::DeviceType::CPU)};
      }
      return d;
    }
    return previous->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &any_delete; }
  // (pure virtual from torch 2.3 on; a plain method before)
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }
};

PlannedAllocator* installed = nullptr;

}  // namespace

// Install the allocator (once per process); later calls do nothing.
void install() {
  std::lock_guard<std::mutex> g(mu);
  if (installed != nullptr) return;
  previous = c10::GetCPUAllocator();
  installed = new PlannedAllocator();  // never freed: tensors may outlive everything
  c10::SetCPUAllocator(installed, /*priority=*/100);
}

bool is_installed() { return installed != nullptr && c10::GetCPUAllocator() == installed; }

// A new arena of `size` bytes (pages are touched as used, once: nothing here gives them
// back before the arena goes). It starts on a 2 MiB boundary and asks for transparent huge
// pages: direct I/O into and out of 4 KiB pages ran at 1.1 and 1.65 GB/s here, against
// 1.75 and 2.4 GB/s with huge pages (pinning a page per 4 KiB for each request).
int64_t create(int64_t size) {
  TORCH_CHECK(size > 0, "arena size must be positive");
  size_t mapped = size_t(size) + kHugePage;
  // (no swap reserved: the pool's mapping is mostly address space never touched)
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  TORCH_CHECK(p != MAP_FAILED, "mmap of a ", size, "-byte arena failed: ", std::strerror(errno));
  auto mapping = static_cast<char*>(p);
  auto base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(mapping) + kHugePage - 1) & ~(kHugePage - 1));
#ifdef MADV_HUGEPAGE
  madvise(base, size_t(size), MADV_HUGEPAGE);  // advice only: without it, 4 KiB pages
#endif
  std::lock_guard<std::mutex> g(mu);
  auto a = new Arena();
  a->base = base;
  a->size = size;
  a->mapping = mapping;
  a->mapped = mapped;
  arenas[next_id] = a;
  return next_id++;
}

Arena* find_locked(int64_t id) {
  auto it = arenas.find(id);
  TORCH_CHECK(it != arenas.end() && !it->second->retired, "no open arena ", id);
  return it->second;
}

// CPU allocations of exactly these sizes go to these offsets of arena `id` while their
// range is free, until the list is replaced; an empty list ends that.
// Each entry: (nbytes, offset, skip): the first `skip` allocations of that size pass.
// `temporaries`: place other allocations of at least this many bytes in free ranges (0: not).
void expect(int64_t id, const std::vector<std::tuple<int64_t, int64_t, int64_t>>& entries, int64_t temporaries) {
  std::lock_guard<std::mutex> g(mu);
  expected.clear();
  temporaries_min = temporaries > 0 ? static_cast<size_t>(temporaries) : 0;
  if (entries.empty() && temporaries_min == 0) {  // (the log stays, for the caller to read)
    expecting = nullptr;
    return;
  }
  alloc_log.clear();
  expecting = find_locked(id);
  for (auto& e : entries)
    expected.push_back({static_cast<size_t>(std::get<0>(e)), static_cast<size_t>(std::get<1>(e)), std::get<2>(e)});
}

// (nbytes, address) of the allocations made while the last non-empty expect() held, in order.
std::vector<std::pair<int64_t, int64_t>> allocations() {
  std::lock_guard<std::mutex> g(mu);
  return alloc_log;
}

// A uint8 tensor of `nbytes` at `offset` of arena `id`, holding [offset, offset + length)
// (length >= nbytes: room a page-rounded read may write), if that range is free; else an
// undefined tensor (None in Python). The range is free again when the tensor's storage dies.
at::Tensor take(int64_t id, int64_t offset, int64_t length, int64_t nbytes) {
  void* p;
  {
    std::lock_guard<std::mutex> g(mu);
    Arena* a = find_locked(id);
    if (offset < 0 || nbytes <= 0 || length < nbytes || !a->is_free(offset, length)) return at::Tensor();
    a->add_block(offset, length);
    a->live_bytes += length;
    p = a->base + offset;
  }
  return torch::from_blob(p, {nbytes}, [](void* q) { arena_delete(q); },
                          torch::TensorOptions().dtype(torch::kUInt8));
}

// Where `ptr` lies in arena `id`: its offset, or -1 outside.
int64_t offset_of(int64_t id, int64_t ptr) {
  std::lock_guard<std::mutex> g(mu);
  Arena* a = find_locked(id);
  auto p = reinterpret_cast<const void*>(ptr);
  return a->holds(p) ? static_cast<const char*>(p) - a->base : -1;
}

// (bytes handed out and alive, allocations placed, allocations passed on while expecting,
// temporaries placed, allocations that went to the pool, the end of the highest block ever
// handed out); the counts are for the process
std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t> stats(int64_t id) {
  std::lock_guard<std::mutex> g(mu);
  Arena* a = find_locked(id);
  return {static_cast<int64_t>(a->live_bytes), placed, passed, temporaries_placed, pooled,
          static_cast<int64_t>(a->high)};
}

// Allocations of at least `min_bytes` that no expected slot takes go to arena `id`'s
// lowest free range, as long as it has one; id 0: no pool.
void use_pool(int64_t id, int64_t min_bytes) {
  std::lock_guard<std::mutex> g(mu);
  if (id == 0) {
    pool = nullptr;
    pool_min = 0;
    return;
  }
  pool = find_locked(id);
  pool_min = static_cast<size_t>(std::max<int64_t>(min_bytes, 1));
}

// Give whole huge pages of arena `id` that no live block touches back to the kernel
// (MADV_DONTNEED: touched again, they come back zeroed), the highest first, until at least
// `want` bytes (all of them if want <= 0); returns the bytes released (pages released
// before and not handed out since are skipped, not counted). For an arena larger
// than the budget, as glibc's heap is trimmed: its resident pages are what the layout
// uses, and free ones go only when RSS nears its bound. Whole 2 MiB pages only: advice on
// part of one would split it, and direct I/O from 4 KiB pages is slower.
int64_t trim_locked(Arena* a, int64_t want) {
  std::vector<std::pair<size_t, size_t>> gaps;  // free [from, to), ascending
  size_t cand = 0;
  for (auto& b : a->live) {
    if (b.first > cand) gaps.emplace_back(cand, b.first);
    cand = std::max(cand, b.first + b.second);
  }
  // (pages above the high-water mark were never touched: nothing to give back there)
  size_t top = std::min(a->size, (a->high + kHugePage - 1) / kHugePage * kHugePage);
  if (top > cand) gaps.emplace_back(cand, top);
  if (a->released.empty()) a->released.assign((a->size + kHugePage - 1) / kHugePage, 0);
  size_t released = 0;
  for (auto it = gaps.rbegin(); it != gaps.rend(); ++it) {
    size_t s = (it->first + kHugePage - 1) / kHugePage * kHugePage, e = it->second / kHugePage * kHugePage;
    // pages given back before and not used since are skipped: they hold nothing resident
    for (size_t at = e; at > s; at -= kHugePage) {
      if (want > 0 && released >= static_cast<size_t>(want)) return static_cast<int64_t>(released);
      size_t page = (at - kHugePage) / kHugePage;
      if (a->released[page]) continue;
      if (madvise(a->base + at - kHugePage, kHugePage, MADV_DONTNEED) == 0) {
        a->released[page] = 1;
        released += kHugePage;
      }
    }
  }
  return static_cast<int64_t>(released);
}

int64_t trim(int64_t id, int64_t want) {
  std::lock_guard<std::mutex> g(mu);
  return trim_locked(find_locked(id), want);
}

// Start (true) or stop counting CPU allocations; starting resets the count and the peak.
void watch(bool on) {
  std::lock_guard<std::mutex> g(mu);
  watching = on;
  if (on) {
    ++watch_gen;
    watch_cur = watch_peak = 0;
  }
}

// (bytes allocated since watch(true) and still alive, their peak)
std::pair<int64_t, int64_t> watched_bytes() {
  std::lock_guard<std::mutex> g(mu);
  return {watch_cur, watch_peak};
}

// No new blocks from arena `id`; its memory goes back when its last block dies.
void retire(int64_t id) {
  std::lock_guard<std::mutex> g(mu);
  auto it = arenas.find(id);
  if (it == arenas.end() || it->second->retired) return;
  Arena* a = it->second;
  if (expecting == a) {
    expecting = nullptr;
    expected.clear();
  }
  if (pool == a) {
    pool = nullptr;
    pool_min = 0;
  }
  a->retired = true;
  if (a->live.empty()) {
    arenas.erase(it);
    unmap(a);
  } else {
    trim_locked(a, 0);  // blocks outlive it (a caller's tensors): only their pages stay
  }
}
