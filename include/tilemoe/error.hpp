#pragma once
// The one error type of tilemoe. Its kind decides the CLI's exit code:
// bad input (the user must change something) is 2, everything else is 1.
#include <stdexcept>
#include <string>

namespace tilemoe {

enum class ErrorKind {
  BadInput,  // a config, a file or an argument that the user must change
  Timeout,   // a bounded wait expired: a peer stalled or a plan is wrong
  Internal,  // a broken invariant inside tilemoe
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] inline void throw_bad_input(const std::string& message) {
  throw Error(ErrorKind::BadInput, message);
}

[[noreturn]] inline void throw_internal(const std::string& message) {
  throw Error(ErrorKind::Internal, message);
}

}  // namespace tilemoe
