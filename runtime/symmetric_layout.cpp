#include "runtime/symmetric_layout.hpp"

#include <cstdlib>
#include <cstring>

namespace loom {

Region SymmetricLayout::add(std::string name, std::uint64_t bytes, std::uint64_t align) {
  if (align == 0 || (align & (align - 1)) != 0)
    throw Error("loom: region '" + name + "' alignment " + std::to_string(align) +
                " is not a power of two");
  for (auto const& r : regions_)
    if (r.name == name) throw Error("loom: symmetric region '" + name + "' added twice");
  std::uint64_t const offset = (bytes_ + align - 1) / align * align;
  bytes_ = offset + bytes;
  regions_.push_back({std::move(name), Region{offset, bytes}});
  return regions_.back().region;
}

Region SymmetricLayout::find(std::string const& name) const {
  for (auto const& r : regions_)
    if (r.name == name) return r.region;
  throw Error("loom: no symmetric region named '" + name + "'");
}

void HostSymmetricHeap::Free::operator()(unsigned char* p) const {
  std::free(p);
}

HostSymmetricHeap::HostSymmetricHeap(SymmetricLayout const& layout, std::uint32_t world)
    : world_(world), bytes_(layout.bytes()) {
  if (world == 0 || world > kMaxRanks)
    throw Error("loom: a symmetric heap spans 1 to " + std::to_string(kMaxRanks) + " ranks, not " +
                std::to_string(world));
  std::uint64_t const size = (bytes_ + 4095) / 4096 * 4096 + 4096;
  for (std::uint32_t r = 0; r < world; ++r) {
    auto* p = static_cast<unsigned char*>(std::aligned_alloc(4096, size));
    if (p == nullptr) throw Error("loom: out of host memory for the symmetric heap");
    std::memset(p, 0, size);
    storage_.emplace_back(p);
  }
}

SymmetricView HostSymmetricHeap::view(std::uint32_t rank) const {
  SymmetricView v{};
  for (std::uint32_t r = 0; r < world_; ++r) v.bases[r] = storage_[r].get();
  v.bytes = bytes_;
  v.rank = rank;
  v.world = world_;
  v.write_log = log_;
  return v;
}

void HostSymmetricHeap::zero() {
  for (auto& s : storage_) std::memset(s.get(), 0, bytes_);
}

void RemoteWriteLog::record(Write const& w) {
  std::lock_guard<std::mutex> lock(mutex_);
  writes_.push_back(w);
}

std::vector<RemoteWriteLog::Write> RemoteWriteLog::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Write> out;
  out.swap(writes_);
  return out;
}

void record_remote_write(void* log, std::uint32_t writer, std::uint32_t target,
                         std::uint64_t offset, std::uint64_t bytes) {
  static_cast<RemoteWriteLog*>(log)->record({writer, target, offset, bytes});
}

}  // namespace loom
