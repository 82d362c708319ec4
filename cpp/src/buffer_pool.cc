#include "p3/buffer_pool.h"

namespace p3 {

BufferPool::~BufferPool() {
  for (auto& [size, list] : free_) {
    for (char* p : list) delete[] p;
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
  return Buffer(this, new char[bytes], bytes);  // not value-initialised: no zero-fill
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
  delete[] data;
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
