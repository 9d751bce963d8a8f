// The rendezvous's tcp: transport. Rank 0 listens (loopback only unless allow_remote) and serves
// the blob to one connecting rank at a time; the others connect, retrying until rank 0 listens.
// Every blocking call is bounded by the rendezvous's deadline.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <thread>
#include <vector>

#include "runtime/bootstrap_io.hpp"

namespace loom::rendezvous_detail {
namespace {

using std::chrono::milliseconds;

std::string endpoint(RendezvousAddress const& a) {
  return a.host + ":" + std::to_string(a.port);
}

// Resolves the host to an IPv4 address; refuses a non-loopback one unless allowed.
sockaddr_in resolve(Party const& p) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int const rc = ::getaddrinfo(p.address.host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr)
    p.fail("cannot resolve host '" + p.address.host +
           "' to an IPv4 address: " + ::gai_strerror(rc));
  sockaddr_in addr{};
  std::memcpy(&addr, found->ai_addr, sizeof addr);
  ::freeaddrinfo(found);
  addr.sin_port = htons(p.address.port);
  bool const loopback = (ntohl(addr.sin_addr.s_addr) >> 24) == 127;
  if (!loopback && !p.options.allow_remote)
    p.fail("host '" + p.address.host +
           "' is not a loopback address; the unique id is served on loopback only unless "
           "RendezvousOptions::allow_remote is set");
  return addr;
}

// Bounds every blocking send, receive and connect on `fd` by `limit` (at least 1 ms: 0 is forever).
void set_io_timeout(Party const& p, int fd, milliseconds limit) {
  auto const ms = std::max<long long>(limit.count(), 1);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
    p.fail("cannot set a socket timeout: " + errno_text(errno));
}

std::string missing_ranks(std::vector<bool> const& served) {
  std::string list;
  for (std::size_t r = 0; r < served.size(); ++r)
    if (!served[r]) list += (list.empty() ? "" : ", ") + std::to_string(r);
  return list;
}

// Serves one connection and marks its rank served. A refused peer is told why (a reply header
// with a status and no blob) before this throws.
void serve_one(Party const& p, int conn, Blob const& blob, std::vector<bool>& served) {
  std::array<unsigned char, kHelloBytes> hello{};
  std::size_t const got = read_up_to(conn, hello.data(), hello.size(), true);
  if (got != hello.size())
    p.fail("short read: a process connected but sent " + std::to_string(got) + " of the " +
           std::to_string(hello.size()) + " hello bytes" +
           (errno ? " (" + errno_text(errno) + ")" : ""));
  Hello h;
  if (!decode_hello(hello.data(), h))
    p.fail("a connection sent no Loom hello (another program on port " +
           std::to_string(p.address.port) + "?)");
  Status status = Status::ok;
  if (h.world != p.world)
    status = Status::wrong_world;
  else if (h.rank == 0 || h.rank >= p.world)
    status = Status::rank_out_of_range;
  else if (served[h.rank])
    status = Status::rank_already_served;
  std::uint64_t const length = status == Status::ok ? blob.size() : 0;
  auto const header = encode_header({p.world, status, length});
  bool const sent = write_all(conn, header.data(), header.size(), true) &&
                    write_all(conn, blob.data(), static_cast<std::size_t>(length), true);
  int const send_errno = errno;
  std::string const who = "rank " + std::to_string(h.rank);
  switch (status) {
    case Status::ok:
      break;
    case Status::wrong_world:
      p.fail(who + " connected with world " + std::to_string(h.world) +
             ", but this job has world " + std::to_string(p.world));
    case Status::rank_out_of_range:
      p.fail("a process connected as " + who + ", outside 1.." + std::to_string(p.world - 1));
    default:
      p.fail(who + " connected twice; two processes were started as the same rank");
  }
  if (!sent) p.fail("cannot send the blob to " + who + ": " + errno_text(send_errno));
  served[h.rank] = true;
}

bool connect_error_is_transient(int e) {
  return e == ECONNREFUSED || e == ECONNRESET || e == ETIMEDOUT || e == EAGAIN ||
         e == EINPROGRESS || e == EHOSTUNREACH || e == ENETUNREACH || e == EINTR;
}

}  // namespace

void publish_tcp(Party const& p, Blob const& blob) {
  sockaddr_in const addr = resolve(p);
  Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener.valid()) p.fail("cannot create a socket: " + errno_text(errno));
  int const one = 1;
  if (::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
    p.fail("cannot set SO_REUSEADDR: " + errno_text(errno));
  if (::bind(listener.get(), reinterpret_cast<sockaddr const*>(&addr), sizeof addr) != 0 ||
      ::listen(listener.get(), static_cast<int>(p.world)) != 0)
    p.fail("cannot listen on " + endpoint(p.address) + ": " + errno_text(errno));

  Deadline const deadline(p.options.timeout);
  std::vector<bool> served(p.world, false);
  served[0] = true;
  for (std::uint32_t left = p.world - 1; left > 0;) {
    if (deadline.passed())
      p.fail("timed out after " + p.timeout_text() + "; rank(s) " + missing_ranks(served) +
             " never fetched the blob");
    pollfd pfd{listener.get(), POLLIN, 0};
    int const ready = ::poll(&pfd, 1, static_cast<int>(deadline.remaining().count()));
    if (ready < 0 && errno != EINTR) p.fail("poll on the listening socket: " + errno_text(errno));
    if (ready <= 0) continue;
    Fd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      p.fail("cannot accept a connection: " + errno_text(errno));
    }
    // A connected rank has already sent its hello or is about to: give it at least a second.
    set_io_timeout(p, conn.get(), std::max(deadline.remaining(), milliseconds(1000)));
    serve_one(p, conn.get(), blob, served);
    --left;
  }
}

Blob fetch_tcp(Party const& p) {
  sockaddr_in const addr = resolve(p);
  Deadline const deadline(p.options.timeout);
  Fd conn;
  for (;;) {
    Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) p.fail("cannot create a socket: " + errno_text(errno));
    set_io_timeout(p, s.get(), deadline.remaining());  // also bounds connect to a remote host
    if (::connect(s.get(), reinterpret_cast<sockaddr const*>(&addr), sizeof addr) == 0) {
      conn = std::move(s);
      break;
    }
    int const e = errno;
    if (!connect_error_is_transient(e))
      p.fail("cannot connect to " + endpoint(p.address) + ": " + errno_text(e));
    if (deadline.passed())
      p.fail("timed out after " + p.timeout_text() + " waiting for rank 0 to listen on " +
             endpoint(p.address) + " (last error: " + errno_text(e) + ")");
    std::this_thread::sleep_for(std::min(milliseconds(20), deadline.remaining()));
  }
  // Rank 0 serves connections one at a time and quickly: the exchange gets at least a second.
  set_io_timeout(p, conn.get(), std::max(deadline.remaining(), milliseconds(1000)));
  auto const hello = encode_hello({p.rank, p.world});
  if (!write_all(conn.get(), hello.data(), hello.size(), true))
    p.fail("cannot send the hello to rank 0: " + errno_text(errno));
  std::array<unsigned char, kHeaderBytes> header{};
  std::size_t const got = read_up_to(conn.get(), header.data(), header.size(), true);
  if (got != header.size())
    p.fail("short read: rank 0 sent " + std::to_string(got) + " of the " +
           std::to_string(header.size()) + " header bytes" +
           (errno ? " (" + errno_text(errno) + ")" : " and closed the connection"));
  std::uint64_t const length = check_header(p, header.data(), "rank 0's reply");
  Blob blob(length);
  std::size_t const body = read_up_to(conn.get(), blob.data(), blob.size(), true);
  if (body != length)
    p.fail("short read: rank 0 sent " + std::to_string(body) + " of " + std::to_string(length) +
           " blob bytes");
  return blob;
}

}  // namespace loom::rendezvous_detail
