// Internal. Reusable payload buffers for received frames. A job's slices come in few sizes (every slice of
// 50,000 elements, plus one tail per key), so the server keeps freed buffers by size and hands them out again:
// a frame costs no allocation and no zero-fill once the pool has warmed up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "p3/status.h"

namespace p3 {

class BufferPool {
 public:
  // Freed buffers are kept while the pool holds at most `keep_bytes` of them; beyond that they are freed.
  explicit BufferPool(uint64_t keep_bytes) : keep_bytes_(keep_bytes) {}
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A move-only handle; gives its memory back to the pool when destroyed. The pool must outlive it.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&& o) noexcept : pool_(o.pool_), data_(o.data_), size_(o.size_) { o.data_ = nullptr; }
    Buffer& operator=(Buffer&& o) noexcept;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() { Reset(); }
    char* data() const { return data_; }
    size_t size() const { return size_; }
    void Reset();

   private:
    friend class BufferPool;
    Buffer(BufferPool* pool, char* data, size_t size) : pool_(pool), data_(data), size_(size) {}
    BufferPool* pool_ = nullptr;
    char* data_ = nullptr;
    size_t size_ = 0;
  };

  // Any thread. A buffer of exactly `bytes` bytes, uninitialised (the caller overwrites it).
  Buffer Take(size_t bytes);
  // Any thread. A buffer of `bytes` bytes filled by calls of `read(dst, n)` in order (a socket's payload).
  // A pooled buffer of that size is reused; otherwise at most kEagerBytes are allocated up front and the buffer
  // grows as bytes arrive, so a header that claims more than its sender sends costs only what was sent.
  static constexpr size_t kEagerBytes = 1 << 20;
  Status Fill(size_t bytes, const std::function<Status(char* dst, size_t n)>& read, Buffer* out);
  // Any thread: buffers handed out that came from the free lists, and that had to be allocated.
  uint64_t reused() const;
  uint64_t allocated() const;

 private:
  void Give(char* data, size_t size);

  const uint64_t keep_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<char*>> free_;  // by size
  uint64_t free_bytes_ = 0;
  uint64_t reused_ = 0;
  uint64_t allocated_ = 0;
};

}  // namespace p3
