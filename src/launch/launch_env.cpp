#include "tilemoe/launch/launch_env.hpp"

#include <cstdlib>
#include <vector>

#include "tilemoe/error.hpp"

namespace tilemoe::launch {

namespace {

// A launcher's variables; nullptr where it has none.
struct Source {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

constexpr Source kTilemoe{"tilemoe launch", "TILEMOE_RANK", "TILEMOE_WORLD_SIZE", "TILEMOE_LOCAL_RANK", "TILEMOE_LOCAL_SIZE"};
constexpr Source kOpenMpi{"OpenMPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE"};

// Strict: decimal digits only (a sign is accepted so that "-1" is reported as negative, not as
// garbage), no spaces, no trailing text, fits an int.
int parse_count(std::string_view name, const std::string& value) {
  const std::string shown = std::string(name) + "='" + value + "'";
  std::size_t i = 0;
  bool negative = false;
  if (i < value.size() && (value[i] == '-' || value[i] == '+')) negative = value[i++] == '-';
  if (i == value.size()) throw_bad_input(shown + " is not a number");
  long long n = 0;
  for (; i < value.size(); ++i) {
    if (value[i] < '0' || value[i] > '9') throw_bad_input(shown + " is not a number");
    n = n * 10 + (value[i] - '0');
    if (n > 1'000'000'000) throw_bad_input(shown + " is too large");
  }
  if (negative && n != 0) throw_bad_input(shown + " is negative");
  return static_cast<int>(n);
}

class Reader {
 public:
  explicit Reader(const GetEnv& getenv) : getenv_(getenv) {}
  std::optional<std::string> raw(const char* name) const { return name ? getenv_(name) : std::nullopt; }
  bool has(const char* name) const { return raw(name).has_value(); }
  std::optional<int> count(const char* name) const {
    const auto value = raw(name);
    if (!value) return std::nullopt;
    return parse_count(name, *value);
  }

 private:
  const GetEnv& getenv_;
};

// Both or neither; the message names the one that is missing.
void require_pair(const Reader& env, const char* a, const char* b, const char* source) {
  if (env.has(a) != env.has(b)) {
    const char* set = env.has(a) ? a : b;
    const char* unset = env.has(a) ? b : a;
    throw_bad_input(std::string(set) + " is set but " + unset + " is not: an incomplete " + source +
                    " environment (both or neither)");
  }
}

void check_ranks(LaunchEnv& env, const Source& s) {
  if (env.world_size < 1) throw_bad_input(std::string(s.size) + "=" + std::to_string(env.world_size) + " must be at least 1");
  if (env.rank >= env.world_size) {
    throw_bad_input(std::string(s.rank) + "=" + std::to_string(env.rank) + " is not below " + s.size + "=" +
                    std::to_string(env.world_size));
  }
  const std::string local_size_name = s.local_size ? s.local_size : "the local size";
  const std::string local_rank_name = s.local_rank ? s.local_rank : "the local rank";
  if (env.local_size < 1) throw_bad_input(local_size_name + "=" + std::to_string(env.local_size) + " must be at least 1");
  if (env.local_rank >= env.local_size) {
    throw_bad_input(local_rank_name + "=" + std::to_string(env.local_rank) + " is not below " + local_size_name + "=" +
                    std::to_string(env.local_size));
  }
  if (env.local_size > env.world_size) {
    throw_bad_input(local_size_name + "=" + std::to_string(env.local_size) + " exceeds " + s.size + "=" +
                    std::to_string(env.world_size));
  }
}

// Launchers whose four variables map one to one.
LaunchEnv read_plain(const Reader& env, const Source& s) {
  require_pair(env, s.rank, s.size, s.name);
  if (!env.has(s.rank)) {
    const char* local = env.has(s.local_rank) ? s.local_rank : s.local_size;
    throw_bad_input(std::string(local) + " is set but " + s.rank + " and " + s.size + " are not: an incomplete " + s.name +
                    " environment");
  }
  require_pair(env, s.local_rank, s.local_size, s.name);
  LaunchEnv out;
  out.source = s.name;
  out.rank = *env.count(s.rank);
  out.world_size = *env.count(s.size);
  out.local_rank = env.count(s.local_rank).value_or(out.rank);
  out.local_size = env.count(s.local_size).value_or(out.world_size);
  check_ranks(out, s);
  return out;
}

// SLURM_TASKS_PER_NODE: comma-separated entries "n" or "n(xk)" (k nodes with n tasks each).
int slurm_tasks_on_node(const std::string& list, std::optional<int> node) {
  const std::string shown = "SLURM_TASKS_PER_NODE='" + list + "'";
  int index = 0;
  std::size_t pos = 0;
  int first = -1;
  while (pos <= list.size()) {
    std::size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    const std::string entry = list.substr(pos, end - pos);
    const std::size_t paren = entry.find('(');
    int tasks = 0, repeat = 1;
    if (paren == std::string::npos) {
      tasks = parse_count("SLURM_TASKS_PER_NODE", entry);
    } else {
      if (entry.size() < paren + 4 || entry.compare(paren, 2, "(x") != 0 || entry.back() != ')') {
        throw_bad_input(shown + " is not a list like '4(x2),3'");
      }
      tasks = parse_count("SLURM_TASKS_PER_NODE", entry.substr(0, paren));
      repeat = parse_count("SLURM_TASKS_PER_NODE", entry.substr(paren + 2, entry.size() - paren - 3));
    }
    if (first < 0) first = tasks;
    if (!node) return first;
    if (*node < index + repeat) return tasks;
    index += repeat;
    pos = end + 1;
  }
  throw_bad_input("SLURM_NODEID=" + std::to_string(*node) + " is beyond the " + std::to_string(index) + " nodes of " + shown);
}

LaunchEnv read_slurm(const Reader& env) {
  const Source s{"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr};
  if (!env.has("SLURM_PROCID")) throw_bad_input("SLURM_LOCALID is set but SLURM_PROCID is not: an incomplete Slurm environment");
  if (!env.has("SLURM_NTASKS")) throw_bad_input("SLURM_PROCID is set but SLURM_NTASKS is not: an incomplete Slurm environment");
  LaunchEnv out;
  out.source = s.name;
  out.rank = *env.count("SLURM_PROCID");
  out.world_size = *env.count("SLURM_NTASKS");
  out.local_rank = env.count("SLURM_LOCALID").value_or(out.rank);
  // SLURM_NTASKS_PER_NODE is what the user asked (--ntasks-per-node), a plain number, but
  // may be missing; SLURM_TASKS_PER_NODE is what Slurm placed, always present under srun.
  const auto per_node = env.raw("SLURM_NTASKS_PER_NODE");
  bool plain = per_node && !per_node->empty();
  for (char c : per_node.value_or("")) plain = plain && c >= '0' && c <= '9';
  Source named = s;
  if (plain) {
    out.local_size = *env.count("SLURM_NTASKS_PER_NODE");
    named.local_size = "SLURM_NTASKS_PER_NODE";
  } else if (const auto list = env.raw("SLURM_TASKS_PER_NODE")) {
    out.local_size = slurm_tasks_on_node(*list, env.count("SLURM_NODEID"));
    named.local_size = "SLURM_TASKS_PER_NODE";
  } else {
    out.local_size = out.world_size;
  }
  if (!env.has("SLURM_LOCALID") && out.local_size != out.world_size) {
    throw_bad_input("SLURM_PROCID is set but SLURM_LOCALID is not, on a node with fewer tasks than the world: an incomplete Slurm environment");
  }
  check_ranks(out, named);
  return out;
}

LaunchEnv read_pmi(const Reader& env) {
  const Source s{"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"};
  require_pair(env, s.rank, s.size, s.name);
  LaunchEnv out;
  out.source = s.name;
  out.rank = *env.count(s.rank);
  out.world_size = *env.count(s.size);
  const auto local_rank = env.count(s.local_rank);
  const auto local_size = env.count(s.local_size);
  if (local_size && !local_rank) throw_bad_input("MPI_LOCALNRANKS is set but MPI_LOCALRANKID is not: an incomplete PMI environment");
  out.local_rank = local_rank.value_or(out.rank);
  out.local_size = local_size.value_or(out.world_size);
  check_ranks(out, s);
  return out;
}

std::string rendezvous_from(const Reader& env) {
  if (const auto address = env.raw("TILEMOE_RENDEZVOUS")) {
    parse_host_port(*address, "TILEMOE_RENDEZVOUS");
    return *address;
  }
  require_pair(env, "MASTER_ADDR", "MASTER_PORT", "MASTER_ADDR/MASTER_PORT");
  if (!env.has("MASTER_ADDR")) return "";
  const std::string host = *env.raw("MASTER_ADDR");
  const std::string port = *env.raw("MASTER_PORT");
  if (host.empty()) throw_bad_input("MASTER_ADDR is empty");
  // An IPv6 literal needs its brackets back to be host:port again.
  const std::string address = (host.find(':') != std::string::npos && host.front() != '[' ? "[" + host + "]" : host) + ":" + port;
  parse_host_port(address, "MASTER_ADDR/MASTER_PORT");
  return address;
}

}  // namespace

HostPort parse_host_port(std::string_view text, std::string_view what) {
  const std::string shown = std::string(what) + "='" + std::string(text) + "'";
  const std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) throw_bad_input(shown + " is not host:port");
  HostPort out;
  std::string_view host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    throw_bad_input(shown + " is not host:port (write an IPv6 address in brackets: [::1]:29571)");
  }
  if (host.empty()) throw_bad_input(shown + " has an empty host");
  out.host = std::string(host);
  const std::string port(text.substr(colon + 1));
  bool digits = !port.empty() && port.size() <= 5;
  for (char c : port) digits = digits && c >= '0' && c <= '9';
  if (!digits) throw_bad_input(shown + " has no valid port (1-65535)");
  out.port = std::stoi(port);
  if (out.port < 1 || out.port > 65535) throw_bad_input(shown + " has no valid port (1-65535)");
  return out;
}

LaunchEnv launch_env_from(const GetEnv& getenv) {
  const Reader env(getenv);
  LaunchEnv out;
  auto any = [&](std::initializer_list<const char*> names) {
    for (const char* n : names) {
      if (env.has(n)) return true;
    }
    return false;
  };
  if (any({kTilemoe.rank, kTilemoe.size, kTilemoe.local_rank, kTilemoe.local_size})) {
    out = read_plain(env, kTilemoe);
  } else if (any({kOpenMpi.rank, kOpenMpi.size, kOpenMpi.local_rank, kOpenMpi.local_size})) {
    out = read_plain(env, kOpenMpi);
  } else if (any({"SLURM_PROCID", "SLURM_LOCALID"})) {
    out = read_slurm(env);
  } else if (any({"PMI_RANK", "PMI_SIZE"})) {
    out = read_pmi(env);
  }
  out.rendezvous = rendezvous_from(env);
  return out;
}

LaunchEnv launch_env() {
  return launch_env_from([](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    if (!value) return std::nullopt;
    return std::string(value);
  });
}

}  // namespace tilemoe::launch
