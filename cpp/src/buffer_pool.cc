#include "buffer_pool.h"

#include <algorithm>
#include <cstdlib>
#include <new>

namespace p3 {

BufferPool::~BufferPool() {
  for (auto& [size, list] : free_) {
    for (char* p : list) std::free(p);
  }
}

BufferPool::Buffer& BufferPool::Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Reset();
    pool_ = o.pool_;
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
  }
  return *this;
}

void BufferPool::Buffer::Reset() {
  if (data_ != nullptr) pool_->Give(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

BufferPool::Buffer BufferPool::Take(size_t bytes) {
  if (bytes == 0) return Buffer(this, nullptr, 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it != free_.end() && !it->second.empty()) {
      char* p = it->second.back();
      it->second.pop_back();
      free_bytes_ -= bytes;
      ++reused_;
      return Buffer(this, p, bytes);
    }
    ++allocated_;
  }
  char* p = static_cast<char*>(std::malloc(bytes));  // not initialised: no zero-fill
  if (p == nullptr) throw std::bad_alloc();
  return Buffer(this, p, bytes);
}

Status BufferPool::Fill(size_t bytes, const std::function<Status(char*, size_t)>& read, Buffer* out) {
  bool pooled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    pooled = bytes <= kEagerBytes || (it != free_.end() && !it->second.empty());
  }
  if (pooled) {
    Buffer b = Take(bytes);
    Status st = bytes == 0 ? Status::Ok() : read(b.data(), bytes);
    if (st.ok()) *out = std::move(b);
    return st;
  }
  size_t capacity = kEagerBytes, filled = 0;
  char* p = static_cast<char*>(std::malloc(capacity));
  while (p != nullptr) {
    Status st = read(p + filled, capacity - filled);
    if (!st.ok()) {
      std::free(p);
      return st;
    }
    filled = capacity;
    if (filled == bytes) break;
    capacity = std::min(bytes, capacity * 2);
    char* grown = static_cast<char*>(std::realloc(p, capacity));  // large blocks move by remapping, not copying
    if (grown == nullptr) std::free(p);
    p = grown;
  }
  if (p == nullptr) throw std::bad_alloc();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++allocated_;
  }
  *out = Buffer(this, p, bytes);
  return Status::Ok();
}

void BufferPool::Give(char* data, size_t size) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_bytes_ + size <= keep_bytes_) {
      free_[size].push_back(data);
      free_bytes_ += size;
      return;
    }
  }
  std::free(data);
}

uint64_t BufferPool::reused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reused_;
}

uint64_t BufferPool::allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

}  // namespace p3
