#pragma once
// What a call refuses as bad input: its message, with a test failure where it throws another kind
// of error or none.
#include <gtest/gtest.h>

#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe::testing {

template <class Call>
std::string refusal(Call call) {
  try {
    call();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

}  // namespace tilemoe::testing
