#include "tilemoe/launch/rendezvous.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>

namespace tilemoe::launch {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Every frame: magic, version, op, sequence number, payload length (little endian), then the
// payload. The magic and version in every frame let a stray connection or a tilemoe of
// another protocol be told apart from a peer in another state.
constexpr std::uint32_t kMagic = 0x56524d54;  // "TMRV"
constexpr std::uint16_t kVersion = 1;
constexpr std::size_t kHeaderBytes = 20;
constexpr std::uint64_t kMaxPayload = std::uint64_t{1} << 30;

enum Op : std::uint16_t { kHello = 1, kWelcome = 2, kAbort = 3, kBroadcast = 4, kAllGather = 5, kBarrier = 6 };

const char* op_name(std::uint16_t op) {
  switch (op) {
    case kHello: return "hello";
    case kWelcome: return "welcome";
    case kAbort: return "abort";
    case kBroadcast: return "broadcast_from_root";
    case kAllGather: return "all_gather";
    case kBarrier: return "barrier";
    default: return "an unknown message";
  }
}

void put_le(std::vector<std::byte>& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xff));
}

std::uint64_t get_le(const std::byte* in, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<std::uint64_t>(in[i]) << (8 * i);
  return value;
}

std::vector<std::byte> make_frame(std::uint16_t op, std::uint32_t seq, std::span<const std::byte> payload) {
  std::vector<std::byte> out;
  out.reserve(kHeaderBytes + payload.size());
  put_le(out, kMagic, 4);
  put_le(out, kVersion, 2);
  put_le(out, op, 2);
  put_le(out, seq, 4);
  put_le(out, payload.size(), 8);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

struct Header {
  std::uint32_t magic = 0;
  std::uint16_t version = 0, op = 0;
  std::uint32_t seq = 0;
  std::uint64_t length = 0;
};

// Owns a descriptor until released: no fd leaks on the error paths.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

std::string errno_text(int error) { return std::strerror(error); }

std::string seconds(milliseconds ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(ms.count()) / 1e3);
  return text;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

// The wait left until `deadline` for poll(), rounded up so that a wait never ends early.
int poll_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

// poll() restarted on EINTR against the same deadline. Returns the number of ready entries.
int poll_until(std::vector<pollfd>& fds, Clock::time_point deadline) {
  for (;;) {
    const int n = ::poll(fds.data(), fds.size(), poll_ms(deadline));
    if (n >= 0) return n;
    if (errno != EINTR) throw_internal("rendezvous: poll failed: " + errno_text(errno));
  }
}

// One frame arriving in pieces on a non-blocking socket.
struct Incoming {
  std::byte head[kHeaderBytes];
  std::size_t head_got = 0;
  Header header;
  std::vector<std::byte> payload;
  std::size_t payload_got = 0;
  bool done = false;
};

struct ReadResult {
  enum { More, Done, Closed, Garbled } state = More;
  int error = 0;         // Closed: errno (0 for an orderly EOF)
  std::string problem;   // Garbled: what is wrong with the header
};

ReadResult read_available(int fd, Incoming& in) {
  ReadResult result;
  for (;;) {
    std::byte* target;
    std::size_t want;
    if (in.head_got < kHeaderBytes) {
      target = in.head + in.head_got;
      want = kHeaderBytes - in.head_got;
    } else {
      target = in.payload.data() + in.payload_got;
      want = in.payload.size() - in.payload_got;
    }
    if (want > 0) {
      const ssize_t n = ::recv(fd, target, want, 0);
      if (n == 0) return {ReadResult::Closed, 0, {}};
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return result;
        return {ReadResult::Closed, errno, {}};
      }
      if (in.head_got < kHeaderBytes) {
        in.head_got += static_cast<std::size_t>(n);
        if (in.head_got < kHeaderBytes) continue;
        in.header.magic = static_cast<std::uint32_t>(get_le(in.head, 4));
        in.header.version = static_cast<std::uint16_t>(get_le(in.head + 4, 2));
        in.header.op = static_cast<std::uint16_t>(get_le(in.head + 6, 2));
        in.header.seq = static_cast<std::uint32_t>(get_le(in.head + 8, 4));
        in.header.length = get_le(in.head + 12, 8);
        if (in.header.magic != kMagic) return {ReadResult::Garbled, 0, "it does not speak the tilemoe rendezvous protocol"};
        if (in.header.version != kVersion) {
          return {ReadResult::Garbled, 0,
                  "it speaks rendezvous protocol version " + std::to_string(in.header.version) + ", this tilemoe " +
                      std::to_string(kVersion) + " (mixed tilemoe builds?)"};
        }
        if (in.header.length > kMaxPayload) {
          return {ReadResult::Garbled, 0, "it announced a message of " + std::to_string(in.header.length) + " bytes, more than 1 GiB"};
        }
        in.payload.resize(static_cast<std::size_t>(in.header.length));
      } else {
        in.payload_got += static_cast<std::size_t>(n);
      }
    }
    if (in.head_got == kHeaderBytes && in.payload_got == in.payload.size()) {
      in.done = true;
      return {ReadResult::Done, 0, {}};
    }
  }
}

enum class SendResult { Sent, Closed, Stalled };

SendResult send_all(int fd, std::span<const std::byte> bytes, Clock::time_point deadline, int* error) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n >= 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      *error = errno;
      return SendResult::Closed;
    }
    std::vector<pollfd> p{{fd, POLLOUT, 0}};
    if (poll_until(p, deadline) == 0) return SendResult::Stalled;
  }
  return SendResult::Sent;
}

std::string closed_text(int error) { return error == 0 ? "closed the connection" : "dropped the connection (" + errno_text(error) + ")"; }

void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // latency only: failure is harmless
}

std::string peer_name(const sockaddr_storage& address) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&address), sizeof address, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  return std::string(host) + ":" + port;
}

// Numeric addresses need no resolver. A host name goes through the system resolver, whose
// own timeouts bound it (getaddrinfo takes no deadline).
struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) ::freeaddrinfo(list);
  }
};

int resolve(const HostPort& where, bool passive, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  const std::string port = std::to_string(where.port);
  int rc = ::getaddrinfo(where.host.c_str(), port.c_str(), &hints, &out.list);
  if (rc == EAI_NONAME) {
    hints.ai_flags &= ~AI_NUMERICHOST;
    rc = ::getaddrinfo(where.host.c_str(), port.c_str(), &hints, &out.list);
  }
  return rc;
}

std::vector<std::byte> abort_payload(ErrorKind kind, const std::string& reason) {
  std::vector<std::byte> out;
  put_le(out, static_cast<std::uint32_t>(kind), 4);
  for (char c : reason) out.push_back(static_cast<std::byte>(c));
  return out;
}

}  // namespace

Rendezvous::Rendezvous(const LaunchEnv& env, std::string address, std::chrono::milliseconds timeout)
    : rank_(env.rank), world_size_(env.world_size), address_(address.empty() ? kDefaultRendezvous : std::move(address)),
      timeout_(timeout), source_(env.source) {
  if (world_size_ < 1 || rank_ < 0 || rank_ >= world_size_) {
    throw_bad_input("rendezvous: rank " + std::to_string(rank_) + " is outside a world of " + std::to_string(world_size_));
  }
  if (timeout_.count() < 1) throw_bad_input("rendezvous: the timeout must be at least 1 ms");
  const HostPort where = parse_host_port(address_, "the rendezvous address");
  host_ = where.host;
  port_ = where.port;
  if (world_size_ == 1) return;
  // A constructor that throws runs no destructor: what was opened is closed here.
  try {
    if (rank_ == 0) {
      join_as_root();
    } else {
      join_as_peer();
    }
  } catch (...) {
    close_all();
    throw;
  }
}

Rendezvous::~Rendezvous() { close_all(); }

void Rendezvous::close_all() {
  if (root_fd_ >= 0) ::close(root_fd_);
  root_fd_ = -1;
  for (int& fd : peer_fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

void Rendezvous::fail(ErrorKind kind, const std::string& reason, int extra_fd) {
  if (rank_ == 0) {
    // Best effort, without waiting: a peer that cannot take it finds the connection closed.
    const std::vector<std::byte> frame = make_frame(kAbort, sequence_, abort_payload(kind, reason));
    std::vector<int> targets(peer_fds_.begin(), peer_fds_.end());
    targets.push_back(extra_fd);
    for (int fd : targets) {
      if (fd < 0) continue;
      [[maybe_unused]] const ssize_t n = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      // A socket closed with unread input resets the connection, which may cost the peer the
      // abort message still in flight; what has arrived is read away first.
      std::byte scratch[4096];
      for (int i = 0; i < 256 && ::recv(fd, scratch, sizeof scratch, MSG_DONTWAIT) > 0; ++i) {
      }
    }
  }
  close_all();
  failed_ = true;
  throw Error(kind, "rendezvous at " + address_ + ": " + reason);
}

void Rendezvous::check_usable(const char* what) const {
  if (failed_) throw_internal("rendezvous at " + address_ + ": " + what + " called after the rendezvous failed");
}

std::chrono::milliseconds Rendezvous::peer_wait() const {
  return timeout_ + std::clamp<milliseconds>(timeout_ / 4, milliseconds(500), milliseconds(5000));
}

void Rendezvous::join_as_root() {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + timeout_;
  AddrInfo resolved;
  if (const int rc = resolve({host_, port_}, true, resolved); rc != 0) {
    throw_bad_input("rendezvous at " + address_ + ": cannot resolve '" + host_ + "': " + ::gai_strerror(rc));
  }
  const addrinfo* ai = resolved.list;
  Fd listener(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
  if (listener.get() < 0) throw_internal("rendezvous at " + address_ + ": socket failed: " + errno_text(errno));
  // A world started right after the previous one on the same port must not wait out the
  // previous connections' TIME_WAIT.
  const int one = 1;
  if (::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) {
    throw_internal("rendezvous at " + address_ + ": SO_REUSEADDR failed: " + errno_text(errno));
  }
  if (::bind(listener.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
    const int error = errno;
    if (error == EADDRINUSE) {
      throw_bad_input("rendezvous at " + address_ + ": port " + std::to_string(port_) +
                      " is already in use (another world or program listens there): choose another port with "
                      "TILEMOE_RENDEZVOUS or tilemoe launch --rendezvous");
    }
    if (error == EADDRNOTAVAIL) {
      throw_bad_input("rendezvous at " + address_ + ": '" + host_ +
                      "' is not an address of this machine, but rank 0 listens there: start rank 0 on that host or "
                      "give its address");
    }
    if (error == EACCES) throw_bad_input("rendezvous at " + address_ + ": port " + std::to_string(port_) + " needs privileges: choose one above 1023");
    throw_internal("rendezvous at " + address_ + ": bind failed: " + errno_text(error));
  }
  if (::listen(listener.get(), world_size_ + 16) != 0) {
    throw_internal("rendezvous at " + address_ + ": listen failed: " + errno_text(errno));
  }

  // Connections whose hello has not arrived yet: their rank is still unknown.
  struct Pending {
    Fd fd;
    std::string from;
    Incoming in;
  };
  std::vector<std::unique_ptr<Pending>> pending;
  std::vector<std::string> from(static_cast<std::size_t>(world_size_));
  peer_fds_.assign(static_cast<std::size_t>(world_size_), -1);
  int joined = 0;
  while (joined < world_size_ - 1) {
    std::vector<pollfd> fds{{listener.get(), POLLIN, 0}};
    for (const auto& p : pending) fds.push_back({p->fd.get(), POLLIN, 0});
    if (poll_until(fds, deadline) == 0) {
      std::vector<int> missing;
      for (int r = 1; r < world_size_; ++r) {
        if (peer_fds_[static_cast<std::size_t>(r)] < 0) missing.push_back(r);
      }
      fail(ErrorKind::Timeout, "rank 0 waited " + seconds(timeout_) + " for " + rank_list(missing) + " to connect (a world of " +
                                   std::to_string(world_size_) + " from " + source_ + ")");
    }
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Pending& p = *pending[i - 1];
      const ReadResult r = read_available(p.fd.get(), p.in);
      if (r.state == ReadResult::Closed) {
        p.fd.reset();  // gone before saying who it is: not a rank of this world, forget it
        continue;
      }
      if (r.state == ReadResult::Garbled) {
        fail(ErrorKind::Internal, "a connection from " + p.from + " was rejected: " + r.problem, p.fd.get());
      }
      if (r.state != ReadResult::Done) continue;
      const Header& h = p.in.header;
      if (h.op != kHello || p.in.payload.size() != 8) {
        fail(ErrorKind::Internal, "a connection from " + p.from + " sent " + op_name(h.op) + " instead of its hello", p.fd.get());
      }
      const auto their_world = static_cast<long long>(get_le(p.in.payload.data(), 4));
      const auto their_rank = static_cast<long long>(get_le(p.in.payload.data() + 4, 4));
      if (their_world != world_size_) {
        fail(ErrorKind::BadInput, "rank " + std::to_string(their_rank) + " (from " + p.from + ") belongs to a world of " +
                                      std::to_string(their_world) + " ranks, rank 0's has " + std::to_string(world_size_) +
                                      ": two launches share this address, or their world sizes differ",
             p.fd.get());
      }
      if (their_rank == 0) {
        fail(ErrorKind::BadInput, "two processes claim rank 0 (this one and one from " + p.from + ")", p.fd.get());
      }
      if (their_rank < 0 || their_rank >= world_size_) {
        fail(ErrorKind::Internal, "a connection from " + p.from + " claims rank " + std::to_string(their_rank) +
                                      ", outside its own world of " + std::to_string(world_size_),
             p.fd.get());
      }
      const auto slot = static_cast<std::size_t>(their_rank);
      if (peer_fds_[slot] >= 0) {
        fail(ErrorKind::BadInput, "two processes claim rank " + std::to_string(their_rank) + " (from " + from[slot] + " and " +
                                      p.from + ")",
             p.fd.get());
      }
      from[slot] = p.from;
      peer_fds_[slot] = p.fd.release();
      ++joined;
    }
    std::erase_if(pending, [](const auto& p) { return p->fd.get() < 0; });
    if (fds[0].revents != 0) {
      for (;;) {
        sockaddr_storage address{};
        socklen_t length = sizeof address;
        Fd fd(::accept4(listener.get(), reinterpret_cast<sockaddr*>(&address), &length, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (fd.get() < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          fail(ErrorKind::Internal, "accept failed: " + errno_text(errno));
        }
        set_nodelay(fd.get());
        pending.push_back(std::make_unique<Pending>(Pending{std::move(fd), peer_name(address), {}}));
      }
    }
  }
  // Later connections (a stray duplicate) are refused by the kernel from now on, and the port
  // is free for the next world.
  listener.reset();
  pending.clear();
  std::vector<std::byte> welcome;
  put_le(welcome, static_cast<std::uint32_t>(world_size_), 4);
  root_send_to_all(kWelcome, welcome, deadline);
}

void Rendezvous::join_as_peer() {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + timeout_;
  AddrInfo resolved;
  std::string last_error = "rank 0 was not listening";
  Fd fd;
  milliseconds backoff(10);
  while (fd.get() < 0) {
    if (!resolved.list) {
      const int rc = resolve({host_, port_}, false, resolved);
      if (rc == EAI_NONAME || rc == EAI_FAIL || rc == EAI_FAMILY || rc == EAI_SERVICE) {
        throw_bad_input("rendezvous at " + address_ + ": cannot resolve '" + host_ + "': " + ::gai_strerror(rc));
      }
      if (rc != 0) {
        resolved.list = nullptr;
        last_error = std::string("cannot resolve '") + host_ + "': " + ::gai_strerror(rc);
      }
    }
    for (const addrinfo* ai = resolved.list; ai && fd.get() < 0; ai = ai->ai_next) {
      Fd attempt(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
      if (attempt.get() < 0) throw_internal("rendezvous at " + address_ + ": socket failed: " + errno_text(errno));
      int error = 0;
      if (::connect(attempt.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
        error = errno;
        if (error == EINPROGRESS || error == EINTR) {
          std::vector<pollfd> p{{attempt.get(), POLLOUT, 0}};
          if (poll_until(p, deadline) == 0) {
            error = ETIMEDOUT;
          } else {
            socklen_t length = sizeof error;
            ::getsockopt(attempt.get(), SOL_SOCKET, SO_ERROR, &error, &length);
          }
        }
      }
      if (error == 0) {
        fd = std::move(attempt);
      } else {
        last_error = errno_text(error);
      }
    }
    if (fd.get() >= 0) break;
    if (Clock::now() >= deadline) {
      throw Error(ErrorKind::Timeout, "rendezvous at " + address_ + ": rank " + std::to_string(rank_) + " waited " +
                                          seconds(timeout_) + " to connect to rank 0 (last error: " + last_error + ")");
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - Clock::now()));
    backoff = std::min(backoff * 2, milliseconds(200));
  }
  set_nodelay(fd.get());
  root_fd_ = fd.release();

  std::vector<std::byte> hello;
  put_le(hello, static_cast<std::uint32_t>(world_size_), 4);
  put_le(hello, static_cast<std::uint32_t>(rank_), 4);
  peer_send(kHello, hello, start + peer_wait());
  const std::vector<std::byte> welcome =
      peer_receive(kWelcome, "report all " + std::to_string(world_size_) + " ranks joined", start + peer_wait());
  if (welcome.size() != 4 || get_le(welcome.data(), 4) != static_cast<std::uint64_t>(world_size_)) {
    fail(ErrorKind::Internal, "rank 0's welcome does not match a world of " + std::to_string(world_size_));
  }
}

std::vector<std::vector<std::byte>> Rendezvous::root_gather(std::uint16_t op, std::span<const std::byte> mine,
                                                            Clock::time_point deadline) {
  std::vector<std::vector<std::byte>> out(static_cast<std::size_t>(world_size_));
  out[0].assign(mine.begin(), mine.end());
  std::vector<Incoming> in(static_cast<std::size_t>(world_size_));
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<int> waiting;
    for (int r = 1; r < world_size_; ++r) {
      if (in[static_cast<std::size_t>(r)].done) continue;
      fds.push_back({peer_fds_[static_cast<std::size_t>(r)], POLLIN, 0});
      waiting.push_back(r);
    }
    if (waiting.empty()) break;
    const std::string what = std::string(op_name(op)) + " #" + std::to_string(sequence_);
    if (poll_until(fds, deadline) == 0) {
      fail(ErrorKind::Timeout, "rank 0 waited " + seconds(timeout_) + " for " + rank_list(waiting) + " to enter " + what);
    }
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int r = waiting[i];
      Incoming& frame = in[static_cast<std::size_t>(r)];
      const ReadResult result = read_available(fds[i].fd, frame);
      if (result.state == ReadResult::Closed) {
        fail(ErrorKind::Timeout, "rank " + std::to_string(r) + " " + closed_text(result.error) + " while rank 0 waited for it to enter " +
                                     what + " (it exited or failed: its own error says why)");
      }
      if (result.state == ReadResult::Garbled) fail(ErrorKind::Internal, "rank " + std::to_string(r) + " sent a bad message: " + result.problem);
      if (result.state != ReadResult::Done) continue;
      if (frame.header.op != op || frame.header.seq != sequence_) {
        fail(ErrorKind::Internal, "rank 0 is in " + what + " but rank " + std::to_string(r) + " entered " + op_name(frame.header.op) +
                                      " #" + std::to_string(frame.header.seq) + ": the ranks call the collectives in different orders");
      }
      out[static_cast<std::size_t>(r)] = std::move(frame.payload);
    }
  }
  return out;
}

void Rendezvous::root_send_to_all(std::uint16_t op, std::span<const std::byte> payload, Clock::time_point deadline) {
  const std::vector<std::byte> frame = make_frame(op, sequence_, payload);
  for (int r = 1; r < world_size_; ++r) {
    int error = 0;
    const SendResult sent = send_all(peer_fds_[static_cast<std::size_t>(r)], frame, deadline, &error);
    if (sent == SendResult::Closed) {
      fail(ErrorKind::Timeout, "rank " + std::to_string(r) + " " + closed_text(error) + " before rank 0's " + op_name(op) +
                                   " reached it (it exited or failed: its own error says why)");
    }
    if (sent == SendResult::Stalled) {
      fail(ErrorKind::Timeout, "rank 0 waited " + seconds(timeout_) + " for rank " + std::to_string(r) + " to take its " + op_name(op));
    }
  }
}

void Rendezvous::peer_send(std::uint16_t op, std::span<const std::byte> payload, Clock::time_point deadline) {
  int error = 0;
  const SendResult sent = send_all(root_fd_, make_frame(op, sequence_, payload), deadline, &error);
  if (sent == SendResult::Closed) {
    fail(ErrorKind::Timeout, "rank 0 " + closed_text(error) + " before rank " + std::to_string(rank_) + "'s " + op_name(op) +
                                 " reached it (it exited or failed: its own error says why)");
  }
  if (sent == SendResult::Stalled) {
    fail(ErrorKind::Timeout, "rank " + std::to_string(rank_) + " waited " + seconds(peer_wait()) + " for rank 0 to take its " + op_name(op));
  }
}

std::vector<std::byte> Rendezvous::peer_receive(std::uint16_t op, const std::string& awaited, Clock::time_point deadline) {
  Incoming frame;
  const std::string me = "rank " + std::to_string(rank_);
  for (;;) {
    std::vector<pollfd> fds{{root_fd_, POLLIN, 0}};
    if (poll_until(fds, deadline) == 0) {
      fail(ErrorKind::Timeout, me + " waited " + seconds(peer_wait()) + " for rank 0 to " + awaited);
    }
    const ReadResult result = read_available(root_fd_, frame);
    if (result.state == ReadResult::Closed) {
      fail(ErrorKind::Timeout, "rank 0 " + closed_text(result.error) + " while " + me + " waited for it to " + awaited +
                                   " (it exited or failed: its own error says why)");
    }
    if (result.state == ReadResult::Garbled) fail(ErrorKind::Internal, "rank 0 sent a bad message: " + result.problem);
    if (result.state == ReadResult::Done) break;
  }
  if (frame.header.op == kAbort && frame.payload.size() >= 4) {
    const auto kind = static_cast<ErrorKind>(get_le(frame.payload.data(), 4));
    const std::string reason(reinterpret_cast<const char*>(frame.payload.data()) + 4, frame.payload.size() - 4);
    fail(kind == ErrorKind::BadInput || kind == ErrorKind::Timeout ? kind : ErrorKind::Internal, "rank 0 gave up: " + reason);
  }
  if (frame.header.op != op || frame.header.seq != sequence_) {
    fail(ErrorKind::Internal, me + " expected rank 0's " + op_name(op) + " #" + std::to_string(sequence_) + " but got " +
                                  op_name(frame.header.op) + " #" + std::to_string(frame.header.seq) +
                                  ": the ranks call the collectives in different orders");
  }
  return std::move(frame.payload);
}

std::vector<std::byte> Rendezvous::broadcast_from_root(std::span<const std::byte> root_bytes) {
  check_usable("broadcast_from_root");
  const Clock::time_point start = Clock::now();
  std::vector<std::byte> out;
  if (world_size_ == 1) {
    out.assign(root_bytes.begin(), root_bytes.end());
  } else if (rank_ == 0) {
    // The peers announce that they are in the broadcast first, so a rank in another
    // collective is caught here rather than left waiting.
    root_gather(kBroadcast, {}, start + timeout_);
    root_send_to_all(kBroadcast, root_bytes, start + timeout_);
    out.assign(root_bytes.begin(), root_bytes.end());
  } else {
    peer_send(kBroadcast, {}, start + peer_wait());
    out = peer_receive(kBroadcast, "send broadcast_from_root #" + std::to_string(sequence_), start + peer_wait());
  }
  ++sequence_;
  return out;
}

std::vector<std::vector<std::byte>> Rendezvous::all_gather(std::span<const std::byte> mine) {
  check_usable("all_gather");
  const Clock::time_point start = Clock::now();
  std::vector<std::vector<std::byte>> out;
  if (world_size_ == 1) {
    out.emplace_back(mine.begin(), mine.end());
  } else if (rank_ == 0) {
    out = root_gather(kAllGather, mine, start + timeout_);
    // Reply: the count, each rank's length, then the bytes in rank order.
    std::vector<std::byte> reply;
    put_le(reply, static_cast<std::uint32_t>(world_size_), 4);
    for (const auto& part : out) put_le(reply, part.size(), 8);
    for (const auto& part : out) reply.insert(reply.end(), part.begin(), part.end());
    root_send_to_all(kAllGather, reply, start + timeout_);
  } else {
    peer_send(kAllGather, mine, start + peer_wait());
    const std::vector<std::byte> reply =
        peer_receive(kAllGather, "send all_gather #" + std::to_string(sequence_) + "'s result", start + peer_wait());
    const std::size_t n = static_cast<std::size_t>(world_size_);
    bool ok = reply.size() >= 4 + 8 * n && get_le(reply.data(), 4) == n;
    std::size_t offset = 4 + 8 * n;
    for (std::size_t r = 0; ok && r < n; ++r) {
      const std::uint64_t length = get_le(reply.data() + 4 + 8 * r, 8);
      ok = length <= reply.size() - offset;
      if (!ok) break;
      out.emplace_back(reply.begin() + static_cast<std::ptrdiff_t>(offset), reply.begin() + static_cast<std::ptrdiff_t>(offset + length));
      offset += static_cast<std::size_t>(length);
    }
    if (!ok || offset != reply.size()) fail(ErrorKind::Internal, "rank 0's all_gather result is malformed");
  }
  ++sequence_;
  return out;
}

void Rendezvous::barrier() {
  check_usable("barrier");
  const Clock::time_point start = Clock::now();
  if (world_size_ == 1) {
    // nothing to wait for
  } else if (rank_ == 0) {
    root_gather(kBarrier, {}, start + timeout_);
    root_send_to_all(kBarrier, {}, start + timeout_);
  } else {
    peer_send(kBarrier, {}, start + peer_wait());
    peer_receive(kBarrier, "release barrier #" + std::to_string(sequence_), start + peer_wait());
  }
  ++sequence_;
}

int pick_free_port(const std::string& host) {
  AddrInfo resolved;
  if (const int rc = resolve({host, 0}, true, resolved); rc != 0) {
    throw_bad_input("cannot resolve '" + host + "' to pick a free port: " + ::gai_strerror(rc));
  }
  const addrinfo* ai = resolved.list;
  Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
  if (fd.get() < 0) throw_internal("picking a free port: socket failed: " + errno_text(errno));
  if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
    throw_bad_input("cannot bind to '" + host + "' to pick a free port: " + errno_text(errno));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
    throw_internal("picking a free port: getsockname failed: " + errno_text(errno));
  }
  if (bound.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port);
  return ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
}

}  // namespace tilemoe::launch
