// The rendezvous's public entry points, the file: transport and the rank environment. The tcp:
// transport is in bootstrap_tcp.cpp; the wire format in bootstrap_io.hpp.
#include "runtime/bootstrap.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <thread>

#include "runtime/bootstrap_io.hpp"
#include "runtime/config.hpp"

namespace loom {
namespace rendezvous_detail {

bool write_all(int fd, void const* data, std::size_t n, bool socket) {
  auto const* p = static_cast<unsigned char const*>(data);
  while (n > 0) {
    ssize_t const w = socket ? ::send(fd, p, n, MSG_NOSIGNAL) : ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

std::size_t read_up_to(int fd, void* data, std::size_t n, bool socket) {
  auto* p = static_cast<unsigned char*>(data);
  std::size_t got = 0;
  while (got < n) {
    ssize_t const r = socket ? ::recv(fd, p + got, n - got, 0) : ::read(fd, p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) errno = 0;
    if (r <= 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

std::uint64_t check_header(Party const& p, unsigned char const* bytes, std::string const& source) {
  Header h;
  if (!decode_header(bytes, h))
    p.fail(source + " does not start with a Loom rendezvous header (another program's data?)");
  switch (h.status) {
    case Status::ok:
      break;
    case Status::wrong_world:
      p.fail("rank 0 serves world " + std::to_string(h.world) +
             " but this rank was started with world " + std::to_string(p.world));
    case Status::rank_out_of_range:
      p.fail("rank 0 refused rank " + std::to_string(p.rank) + ": outside 1.." +
             std::to_string(h.world - 1));
    case Status::rank_already_served:
      p.fail("rank 0 already served a rank " + std::to_string(p.rank) +
             "; two processes were started as the same rank");
    default:
      p.fail(source + " holds unknown status " + std::to_string(static_cast<unsigned>(h.status)));
  }
  if (h.world != p.world)
    p.fail("rank 0 published for world " + std::to_string(h.world) +
           " but this rank was started with world " + std::to_string(p.world));
  if (h.length > kMaxRendezvousBlobBytes)
    p.fail(source + " announces " + std::to_string(h.length) + " blob bytes, more than the " +
           std::to_string(kMaxRendezvousBlobBytes) + " a rendezvous carries");
  return h.length;
}

// ---- file: -------------------------------------------------------------------------------------

void publish_file(Party const& p, Blob const& blob) {
  std::string const& path = p.address.path;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0)
    p.fail("the file already exists (left by an earlier job?); give every job a fresh path");
  // Written under a temporary name and renamed: a reader sees no file or the whole file.
  std::string const tmp = path + ".tmp." + std::to_string(::getpid());
  {
    Fd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!f.valid()) p.fail("cannot create " + tmp + ": " + errno_text(errno));
    auto const header = encode_header({p.world, Status::ok, blob.size()});
    if (!write_all(f.get(), header.data(), header.size(), false) ||
        !write_all(f.get(), blob.data(), blob.size(), false)) {
      int const e = errno;
      ::unlink(tmp.c_str());
      p.fail("cannot write " + tmp + ": " + errno_text(e));
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int const e = errno;
    ::unlink(tmp.c_str());
    p.fail("cannot rename " + tmp + " to " + path + ": " + errno_text(e));
  }
}

Blob fetch_file(Party const& p) {
  using std::chrono::milliseconds;
  std::string const& path = p.address.path;
  Deadline const deadline(p.options.timeout);
  Fd f;
  for (;;) {
    f = Fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (f.valid()) break;
    if (errno != ENOENT) p.fail("cannot open " + path + ": " + errno_text(errno));
    if (deadline.passed())
      p.fail("timed out after " + p.timeout_text() + " waiting for rank 0 to write " + path);
    std::this_thread::sleep_for(std::min(milliseconds(10), deadline.remaining()));
  }
  std::array<unsigned char, kHeaderBytes> header{};
  std::size_t const got = read_up_to(f.get(), header.data(), header.size(), false);
  if (got != header.size())
    p.fail(path + " is truncated: it holds " + std::to_string(got) + " bytes, fewer than the " +
           std::to_string(header.size()) + "-byte header");
  std::uint64_t const length = check_header(p, header.data(), path);
  Blob blob(length);
  std::size_t const body = read_up_to(f.get(), blob.data(), blob.size(), false);
  if (body != length)
    p.fail(path + " is truncated: " + std::to_string(body) + " of " + std::to_string(length) +
           " blob bytes");
  return blob;
}

}  // namespace rendezvous_detail

namespace {

char const* const kLaunchHint =
    "; start each rank with scripts/launch.sh -n P -- program, which sets LOOM_RANK, LOOM_WORLD, "
    "LOOM_RENDEZVOUS and LOOM_DEVICE";

std::uint64_t parse_unsigned(char const* name, std::string const& text) {
  std::uint64_t value = 0;
  auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    throw Error(std::string("loom: ") + name + "='" + text + "' is not a non-negative integer");
  return value;
}

std::string required_variable(char const* name) {
  char const* v = std::getenv(name);
  if (v == nullptr) throw Error(std::string("loom: ") + name + " is not set" + kLaunchHint);
  return v;
}

}  // namespace

RendezvousAddress RendezvousAddress::parse(std::string const& text) {
  auto bad = [&](std::string const& why) -> RendezvousAddress {
    throw Error("loom: rendezvous address '" + text + "' " + why +
                "; expected file:/path/to/file or tcp:HOST:PORT");
  };
  RendezvousAddress a;
  a.text = text;
  if (text.rfind("file:", 0) == 0) {
    a.scheme = Scheme::file;
    a.path = text.substr(5);
    if (a.path.empty()) return bad("names no file");
    return a;
  }
  if (text.rfind("tcp:", 0) != 0) return bad("has no file: or tcp: scheme");
  a.scheme = Scheme::tcp;
  std::string const rest = text.substr(4);
  auto const colon = rest.rfind(':');
  if (colon == std::string::npos) return bad("has no port");
  a.host = rest.substr(0, colon);
  std::string const port = rest.substr(colon + 1);
  if (a.host.empty()) return bad("has no host");
  if (a.host.find(':') != std::string::npos) return bad("has an IPv6 host, which is not supported");
  unsigned value = 0;
  auto const [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value == 0 ||
      value > 65535)
    return bad("has port '" + port + "', not a number in 1..65535");
  a.port = static_cast<std::uint16_t>(value);
  return a;
}

void publish_blob(RendezvousAddress const& address, std::uint32_t world, Blob const& blob,
                  RendezvousOptions const& options) {
  rendezvous_detail::Party const p{address, 0, world, options};
  if (world == 0) p.fail("world size 0");
  if (blob.size() > kMaxRendezvousBlobBytes)
    p.fail("a blob of " + std::to_string(blob.size()) + " bytes exceeds the " +
           std::to_string(kMaxRendezvousBlobBytes) + " a rendezvous carries");
  if (world == 1) return;
  if (address.scheme == RendezvousAddress::Scheme::file)
    rendezvous_detail::publish_file(p, blob);
  else
    rendezvous_detail::publish_tcp(p, blob);
}

Blob fetch_blob(RendezvousAddress const& address, std::uint32_t rank, std::uint32_t world,
                RendezvousOptions const& options) {
  rendezvous_detail::Party const p{address, rank, world, options};
  if (rank == 0 || rank >= world)
    p.fail("only ranks 1.." + std::to_string(world == 0 ? 0 : world - 1) + " fetch the blob");
  return address.scheme == RendezvousAddress::Scheme::file ? rendezvous_detail::fetch_file(p)
                                                           : rendezvous_detail::fetch_tcp(p);
}

Blob share_blob(std::string const& address, std::uint32_t rank, std::uint32_t world,
                Blob const& blob_on_rank0, RendezvousOptions const& options) {
  if (rank >= world)
    throw Error("loom: rendezvous '" + address + "': rank " + std::to_string(rank) +
                " is outside world " + std::to_string(world));
  if (world == 1) return blob_on_rank0;
  RendezvousAddress const a = RendezvousAddress::parse(address);
  if (rank != 0) return fetch_blob(a, rank, world, options);
  publish_blob(a, world, blob_on_rank0, options);
  return blob_on_rank0;
}

RankEnvironment RankEnvironment::from_environment() {
  RankEnvironment env;
  std::uint64_t const rank = parse_unsigned("LOOM_RANK", required_variable("LOOM_RANK"));
  std::uint64_t const world = parse_unsigned("LOOM_WORLD", required_variable("LOOM_WORLD"));
  if (world == 0 || world > static_cast<std::uint64_t>(kMaxRanks))
    throw Error("loom: LOOM_WORLD=" + std::to_string(world) + " is outside 1.." +
                std::to_string(kMaxRanks) + " (the most ranks a symmetric heap spans)");
  if (rank >= world)
    throw Error("loom: LOOM_RANK=" + std::to_string(rank) +
                " is not below LOOM_WORLD=" + std::to_string(world));
  env.rank = static_cast<std::uint32_t>(rank);
  env.world = static_cast<std::uint32_t>(world);

  char const* rendezvous = std::getenv("LOOM_RENDEZVOUS");
  env.rendezvous = rendezvous ? rendezvous : "";
  if (env.rendezvous.empty() && world > 1)
    throw Error("loom: LOOM_RENDEZVOUS is not set but LOOM_WORLD=" + std::to_string(world) +
                kLaunchHint);
  if (!env.rendezvous.empty()) RendezvousAddress::parse(env.rendezvous);

  char const* device = std::getenv("LOOM_DEVICE");
  if (device == nullptr || *device == '\0') {
    env.device = static_cast<int>(rank);
  } else {
    std::uint64_t const d = parse_unsigned("LOOM_DEVICE", device);
    if (d > 1024) throw Error("loom: LOOM_DEVICE=" + std::to_string(d) + " is not a CUDA device");
    env.device = static_cast<int>(d);
  }
  return env;
}

}  // namespace loom
