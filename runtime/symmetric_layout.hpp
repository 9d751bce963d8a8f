// Host-side layout builder for the symmetric heap: named regions at fixed offsets, identical on
// every rank. HostSymmetricHeap backs it with one host allocation per virtual rank (CPU executor).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/error.hpp"
#include "runtime/symmetric.hpp"

namespace loom {

struct Region {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

class SymmetricLayout {
 public:
  // Reserves `bytes` (aligned to `align`) under a unique name.
  Region add(std::string name, std::uint64_t bytes, std::uint64_t align = 256);
  template <class T>
  Region add_array(std::string name, std::uint64_t count) {
    return add(std::move(name), count * sizeof(T), alignof(T) > 256 ? alignof(T) : 256);
  }
  Region find(std::string const& name) const;
  std::uint64_t bytes() const { return bytes_; }

 private:
  struct Named {
    std::string name;
    Region region;
  };
  std::vector<Named> regions_;
  std::uint64_t bytes_ = 0;
};

// Every put made through SymmetricView::put_serial while attached to a HostSymmetricHeap: who
// wrote which bytes of which rank's heap. Tests use it to prove the layout write-conflict-free.
class RemoteWriteLog {
 public:
  struct Write {
    std::uint32_t writer;  // rank that issued the put
    std::uint32_t target;  // rank whose heap it wrote
    std::uint64_t offset;  // in the target's heap
    std::uint64_t bytes;
  };
  void record(Write const& w);
  std::vector<Write> take();

 private:
  std::mutex mutex_;
  std::vector<Write> writes_;
};

// One zeroed host allocation per rank, for the CPU executor's virtual ranks.
class HostSymmetricHeap {
 public:
  HostSymmetricHeap(SymmetricLayout const& layout, std::uint32_t world);
  std::uint32_t world() const { return world_; }
  SymmetricView view(std::uint32_t rank) const;
  // Views made after this report their puts to `log` (null: stop logging).
  void set_write_log(RemoteWriteLog* log) { log_ = log; }
  // Zeroes every rank's heap (between launches only).
  void zero();
  template <class T>
  T* local(std::uint32_t rank, Region r) const {
    return reinterpret_cast<T*>(storage_[rank].get() + r.offset);
  }

 private:
  struct Free {
    void operator()(unsigned char* p) const;
  };
  std::uint32_t world_;
  std::uint64_t bytes_;
  RemoteWriteLog* log_ = nullptr;
  std::vector<std::unique_ptr<unsigned char[], Free>> storage_;
};

}  // namespace loom
