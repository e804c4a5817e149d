#pragma once
// The one error type of tilemoe. Its kind decides the CLI's exit code:
// bad input (the user must change something) is 2, everything else is 1.
#include <exception>
#include <stdexcept>
#include <string>

namespace tilemoe {

enum class ErrorKind {
  BadInput,  // a config, a file or an argument that the user must change
  Timeout,   // a bounded wait expired: a peer stalled or a plan is wrong
  Internal,  // a broken invariant inside tilemoe
  OutOfMemory,  // the device had no memory left for an allocation: a smaller problem may fit
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

// What a caught exception says and its kind: Internal for anything that is not a tilemoe::Error
// (a std::exception's what(), or a fixed text for the rest). For code that collects the errors
// of several threads (one per rank) and reports them afterwards.
struct ErrorReport {
  ErrorKind kind = ErrorKind::Internal;
  std::string message;
};

inline ErrorReport report_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return {e.kind(), e.what()};
  } catch (const std::exception& e) {
    return {ErrorKind::Internal, e.what()};
  } catch (...) {
    return {ErrorKind::Internal, "an exception that is not a std::exception"};
  }
}

}  // namespace tilemoe
